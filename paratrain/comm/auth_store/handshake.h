// The authenticated store's handshake: a challenge-response that proves both
// ends know the job's token, in libsodium's HMAC-SHA512/256. Only this file's
// .cpp sees sodium.h (so the precompiled header stays valid); without
// libsodium available() is false and everything else throws.
// Not here: sockets and framing (wire.h), the server loop (server.h).
//
// The exchange (Note [Store handshake] in handshake.cpp):
//   server -> client  "PTSTORE1" | nonce_s (32 random bytes)
//   client -> server  "PTSTORE1" | u16 job_len | job id | nonce_c | mac_c
//   server -> client  status (0 = admitted | mac_s, else a Refusal and close)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace paratrain::comm::auth {

inline constexpr std::string_view kMagic = "PTSTORE1";
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
// Job ids are run ids (TORCHELASTIC_RUN_ID): short names, bounded so a
// peer cannot make the server buffer much before it is authenticated.
inline constexpr std::size_t kMaxJobIdBytes = 256;

using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Mac = std::array<std::uint8_t, kMacBytes>;

// The server's answer to a client's hello (one byte on the wire).
enum class Verdict : std::uint8_t { admitted = 0, wrong_token = 1, wrong_job = 2, malformed = 3 };

// Whether this build has libsodium (PARATRAIN_HAVE_SODIUM).
bool available();

// A fresh nonce from libsodium's CSPRNG. Throws CommError without libsodium.
Nonce random_nonce();

// The client's proof: HMAC_token("paratrain-store-client" | nonce_s | nonce_c | job).
Mac client_mac(std::string_view token, const Nonce& server_nonce, const Nonce& client_nonce, std::string_view job);
// The server's proof back, over the nonces in the other order and another
// label, so a client's MAC can never be replayed as the server's.
Mac server_mac(std::string_view token, const Nonce& server_nonce, const Nonce& client_nonce, std::string_view job);

// Constant-time comparison (sodium_memcmp).
bool equal(const Mac& a, const Mac& b);

}  // namespace paratrain::comm::auth

// libsodium behind the store's handshake: see handshake.h.
#include "paratrain/comm/auth_store/handshake.h"

#include "paratrain/core/error.h"

#ifdef PARATRAIN_HAVE_SODIUM
#include <sodium.h>
#endif

namespace paratrain::comm::auth {
namespace {

// Note [Store handshake]
// The server speaks first with a fresh nonce, so a recorded client answer is
// worth nothing on the next connection. The client's MAC covers that nonce,
// its own nonce and the job id it claims, keyed by the token: a process
// without the token cannot produce it, and one with another job's token or
// job id produces a MAC the server rejects. The server then proves it knows
// the token too (over the client's nonce), so a process that grabbed
// MASTER_PORT first cannot pose as the job's store and feed ranks false keys.
// HMAC-SHA512/256 takes keys of any length, so the token is used as is.
// Everything after the handshake is plain (not encrypted, not MACed): the
// threat is other users and other jobs joining, not a network attacker who
// can rewrite packets (docs/launchers.md, "Security of the rendezvous").
#ifdef PARATRAIN_HAVE_SODIUM
void init_sodium() {
  // Thread-safe and idempotent; -1 only when no entropy source exists.
  if (sodium_init() < 0) throw CommError("libsodium could not initialise (no entropy source?)");
}

Mac mac_of(std::string_view label, std::string_view token, const Nonce& first, const Nonce& second,
           std::string_view job) {
  init_sodium();
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, reinterpret_cast<const unsigned char*>(token.data()), token.size());
  crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  crypto_auth_hmacsha512256_update(&st, first.data(), first.size());
  crypto_auth_hmacsha512256_update(&st, second.data(), second.size());
  crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(job.data()), job.size());
  Mac out{};
  static_assert(crypto_auth_hmacsha512256_BYTES == kMacBytes);
  crypto_auth_hmacsha512256_final(&st, out.data());
  sodium_memzero(&st, sizeof st);
  return out;
}
#else
[[noreturn]] void no_sodium() {
  throw CommError("this paratrain was built without libsodium, so the authenticated store is unavailable; "
                  "install libsodium-dev and rebuild");
}
#endif

}  // namespace

bool available() {
#ifdef PARATRAIN_HAVE_SODIUM
  return true;
#else
  return false;
#endif
}

Nonce random_nonce() {
#ifdef PARATRAIN_HAVE_SODIUM
  init_sodium();
  Nonce n{};
  randombytes_buf(n.data(), n.size());
  return n;
#else
  no_sodium();
#endif
}

// The labels end in a NUL so that no label is a prefix of another's input.
Mac client_mac(std::string_view token, const Nonce& server_nonce, const Nonce& client_nonce, std::string_view job) {
#ifdef PARATRAIN_HAVE_SODIUM
  return mac_of(std::string_view("paratrain-store-client\0", 23), token, server_nonce, client_nonce, job);
#else
  no_sodium();
#endif
}

Mac server_mac(std::string_view token, const Nonce& server_nonce, const Nonce& client_nonce, std::string_view job) {
#ifdef PARATRAIN_HAVE_SODIUM
  return mac_of(std::string_view("paratrain-store-server\0", 23), token, client_nonce, server_nonce, job);
#else
  no_sodium();
#endif
}

bool equal(const Mac& a, const Mac& b) {
#ifdef PARATRAIN_HAVE_SODIUM
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
#else
  no_sodium();
#endif
}

}  // namespace paratrain::comm::auth

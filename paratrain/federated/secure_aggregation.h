// Secure aggregation of client updates (federated.secure_aggregation): the
// pairwise-masking core of Bonawitz et al., "Practical Secure Aggregation for
// Privacy-Preserving Machine Learning" (CCS'17), with X25519 and ChaCha20
// from libsodium. The server learns the sum of the reporting clients'
// updates and nothing else about any one of them. Not the round around it
// (round.h) and no cryptography of our own: key agreement, hashing and the
// stream cipher are libsodium's.
//
// Note [Pairwise masks]
// 1. Advertise: each participant u draws a fresh X25519 key pair for the
//    round and sends its public key; the server relays every key to all.
// 2. Mask: u quantizes its vector x_u to fixed point (kFractionBits) in
//    Z_{2^64} and adds, for every other participant v, the ChaCha20 stream
//    keyed by s_uv = H(DH(sk_u, pk_v), pk_lo, pk_hi, round): +stream when
//    u < v, -stream when u > v. Both ends derive the same s_uv, so the masks
//    of every pair cancel in the sum and each masked vector on its own is
//    uniform noise to whoever lacks s_uv.
// 3. Upload: the server adds the masked vectors mod 2^64.
// 4. Unmask: participants that advertised but never uploaded (their
//    training failed, their process died) left their pairs' masks in the
//    sum. Each survivor u sends s_uv for every dropped v; the server
//    regenerates those streams and removes them. Then the sum is the
//    survivors' quantized sum, which it converts back to floating point.
//
// What is tolerated, precisely: any number of participants may drop
// between advertising and uploading (step 4 recovers); clients that drop
// before advertising (the simulated dropouts, drawn at the round's start)
// are simply not participants. A survivor that fails during step 4 fails
// the round with CommError (Bonawitz's Shamir-shared keys, which let t of n
// survivors finish it, are not built). Threat model: an honest-but-curious
// server that reports dropouts truthfully; without Bonawitz's second
// (self) mask, a server that falsely declared a live client dropped could
// unmask it, so this is not secure against a malicious server.
//
// The federated round itself moves these messages point to point
// (round.h, Note [Federated mailbox]) with mask_vector and remove_mask;
// SecureAggregationRound below is the same protocol over collectives.
//
// In this simulation one rank may host several clients; each client masks
// its own vector and the rank adds the masked vectors before the upload,
// which changes the messages, not what the server can learn.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::federated {

// Whether paratrain was built with libsodium (scripts/install-deps.sh
// installs libsodium-dev). Without it, secure aggregation is a ConfigError.
bool secure_aggregation_available();

using Key = std::array<uint8_t, 32>;

// Fixed point: x is sent as round(x * 2^kFractionBits) mod 2^64. 2^-32 is far
// below float32's resolution of an update, and 2^63 / 2^32 leaves room for
// sums up to ~2e9 in magnitude.
inline constexpr int kFractionBits = 32;

// Client side, one participant: its key pair for one round.
struct KeyPair {
  Key public_key{};
  Key secret_key{};
};
KeyPair make_key_pair();
// Overwrites the secret key (libsodium's memzero, which the compiler keeps):
// secret keys live for one round.
void wipe(KeyPair& key);

// s_uv as both ends compute it (Note [Pairwise masks], step 2). Throws
// CommError when `theirs` is not a valid public key.
Key pairwise_seed(const KeyPair& mine, const Key& theirs, int64_t round);

// x (float, any shape) as fixed point in Z_{2^64} (int64 lanes holding the
// two's-complement bits). Throws Error when |x| * 2^kFractionBits * limit
// would reach 2^63: the sum of `limit` such vectors could wrap.
at::Tensor to_fixed_point(const at::Tensor& x, int64_t limit);
// The inverse for a sum: int64 lanes read as signed, scaled back (float64).
at::Tensor from_fixed_point(const at::Tensor& sum);
// target += sign * ChaCha20(seed) mod 2^64, over target's int64 lanes.
void add_stream(at::Tensor& target, const Key& seed, int sign);
// target += other mod 2^64 (int64 lanes).
void add_mod(at::Tensor& target, const at::Tensor& other);

// Step 2 for participant number `index` (in the sorted participant list
// whose public keys are `public_keys`): `values` (float, any shape) in fixed
// point for `limit` participants, plus its pairwise masks with every other
// participant. What leaves the client.
at::Tensor mask_vector(const KeyPair& mine, int64_t index, const std::vector<Key>& public_keys, int64_t round,
                       const at::Tensor& values, int64_t limit);
// Step 4 on the server: removes from `sum` the mask that survivor number
// `survivor` added for dropped participant number `dropped`, given their
// shared seed s_uv (revealed by the survivor).
void remove_mask(at::Tensor& sum, const Key& seed, int64_t survivor, int64_t dropped);

// How keys travel in the round's messages (mailbox.h): one int64 row per
// client, its id then `per_row` keys of 32 byte values each. `keys` holds
// ids.size() * per_row keys, row by row.
at::Tensor key_rows(const std::vector<int64_t>& ids, const std::vector<Key>& keys, int64_t per_row);
// The inverse; throws CommError when `rows` is not [n, 1 + 32 per_row] of bytes.
void read_key_rows(const at::Tensor& rows, int64_t per_row, std::vector<int64_t>& ids, std::vector<Key>& keys);

// One round of Note [Pairwise masks] over collectives, called on every rank of `world` in the
// same order (rank 0 is the server; any rank may host clients).
class SecureAggregationRound {
 public:
  // Collective (step 1). `participants`: the clients taking part, sorted and
  // the same on every rank; `hosted(c)`: whether this rank hosts client c.
  // `length`: elements of every client's vector.
  SecureAggregationRound(comm::ProcessGroup& world, int64_t round, std::vector<int64_t> participants,
                         const std::function<bool(int64_t)>& hosted, int64_t length);
  ~SecureAggregationRound();
  SecureAggregationRound(const SecureAggregationRound&) = delete;
  SecureAggregationRound& operator=(const SecureAggregationRound&) = delete;

  // Local (step 2): client c (hosted here, once) contributes `values`
  // (float, `length` elements), masked before it leaves the client.
  void add(int64_t client, const at::Tensor& values);

  // Collective (steps 3-4): on the server, the sum of every added vector
  // (float64 [length]); an undefined tensor elsewhere. Participants hosted
  // anywhere that never called add() are the dropped ones.
  at::Tensor aggregate();

  // After aggregate(): the participants whose vector is not in the sum.
  const std::vector<int64_t>& dropped() const { return dropped_; }
  // Server, after aggregate(): the masked uploads it received, one per rank
  // (int64 lanes), for audits and tests: each looks uniformly random unless
  // it holds every participant's mask pair.
  const std::vector<at::Tensor>& received() const { return received_; }
  // Bytes one client sends and receives beyond the plain protocol: its
  // public key up, every public key down, 8 bytes per element instead of 4,
  // and one seed per dropped participant.
  int64_t extra_bytes_up_per_client() const;
  int64_t extra_bytes_down_per_client() const;

 private:
  comm::ProcessGroup& world_;
  int64_t round_;
  std::vector<int64_t> participants_;
  int64_t length_;
  std::map<int64_t, KeyPair> hosted_keys_;  // this rank's participants
  std::vector<Key> public_keys_;            // per participant index
  std::vector<bool> added_;                 // per participant index (hosted here)
  at::Tensor upload_;                       // this rank's sum of masked vectors
  std::vector<int64_t> dropped_;
  std::vector<at::Tensor> received_;

  int64_t index_of(int64_t client) const;
};

}  // namespace paratrain::federated

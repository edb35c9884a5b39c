// Secure aggregation: see Note [Pairwise masks] in secure_aggregation.h.
#include "paratrain/federated/secure_aggregation.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "paratrain/core/error.h"

#ifdef PARATRAIN_HAVE_SODIUM
#include <sodium.h>
#endif

namespace paratrain::federated {
namespace {

constexpr int64_t kKeyBytes = 32;

[[noreturn]] void no_sodium() {
  throw ConfigError(
      "federated.secure_aggregation = true, but paratrain was built without libsodium; install it "
      "(scripts/install-deps.sh installs libsodium-dev), rebuild, or set federated.secure_aggregation = false");
}

uint64_t* lanes(at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.is_contiguous() && t.device().is_cpu(),
              "secure aggregation works on contiguous CPU int64 tensors");
  return reinterpret_cast<uint64_t*>(t.data_ptr<int64_t>());
}

// Keys travel as int64 tensors of byte values: the comm layer sums int64 on
// every backend, and only one rank writes each key's row (the others send
// zeros), so a sum is a relay.
at::Tensor keys_to_tensor(const std::vector<Key>& keys) {
  auto t = torch::zeros({static_cast<int64_t>(keys.size()), kKeyBytes}, torch::kLong);
  auto* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < keys.size(); ++i) {
    for (int64_t b = 0; b < kKeyBytes; ++b) p[i * kKeyBytes + b] = keys[i][b];
  }
  return t;
}

Key key_at(const at::Tensor& t, int64_t row) {
  Key k;
  const auto* p = t.data_ptr<int64_t>() + row * kKeyBytes;
  for (int64_t b = 0; b < kKeyBytes; ++b) k[b] = static_cast<uint8_t>(p[b]);
  return k;
}

}  // namespace

bool secure_aggregation_available() {
#ifdef PARATRAIN_HAVE_SODIUM
  return true;
#else
  return false;
#endif
}

#ifdef PARATRAIN_HAVE_SODIUM

namespace {
void init_sodium() {
  // Thread-safe and idempotent; -1 only when no entropy source is usable.
  if (sodium_init() < 0) throw Error("libsodium failed to initialize (no usable random source)");
}
}  // namespace

KeyPair make_key_pair() {
  init_sodium();
  KeyPair k;
  crypto_box_keypair(k.public_key.data(), k.secret_key.data());  // X25519
  return k;
}

void wipe(KeyPair& key) { sodium_memzero(key.secret_key.data(), key.secret_key.size()); }

Key pairwise_seed(const KeyPair& mine, const Key& theirs, int64_t round) {
  init_sodium();
  unsigned char shared[crypto_scalarmult_BYTES];
  if (crypto_scalarmult(shared, mine.secret_key.data(), theirs.data()) != 0)
    throw CommError("secure aggregation: a peer's public key is invalid (a low-order point); the round cannot "
                    "be masked");
  // The raw X25519 output is not a uniform key: hash it with both public
  // keys (in a fixed order, so both ends agree) and the round.
  const Key& lo = std::min(mine.public_key, theirs);
  const Key& hi = std::max(mine.public_key, theirs);
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, kKeyBytes);
  crypto_generichash_update(&h, shared, sizeof shared);
  crypto_generichash_update(&h, lo.data(), lo.size());
  crypto_generichash_update(&h, hi.data(), hi.size());
  crypto_generichash_update(&h, reinterpret_cast<const unsigned char*>(&round), sizeof round);
  Key seed;
  crypto_generichash_final(&h, seed.data(), seed.size());
  sodium_memzero(shared, sizeof shared);
  return seed;
}

void add_stream(at::Tensor& target, const Key& seed, int sign) {
  uint64_t* t = lanes(target);
  const int64_t n = target.numel();
  // ChaCha20 keystream in blocks, so the buffer stays small for big models.
  constexpr int64_t kChunk = 1 << 14;
  std::vector<uint64_t> stream(static_cast<size_t>(std::min(n, kChunk)));
  unsigned char nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {0};  // fresh key per round and pair
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    // The keystream is ChaCha20 over zeros (in place). The IETF variant's
    // block counter picks up where the last chunk ended (64-byte blocks;
    // kChunk * 8 bytes is a whole number of them).
    auto* bytes = reinterpret_cast<unsigned char*>(stream.data());
    std::fill(stream.begin(), stream.begin() + len, 0);
    crypto_stream_chacha20_ietf_xor_ic(bytes, bytes, static_cast<unsigned long long>(len * 8), nonce,
                                       static_cast<uint32_t>(start * 8 / 64), seed.data());
    if (sign > 0) {
      for (int64_t i = 0; i < len; ++i) t[start + i] += stream[static_cast<size_t>(i)];
    } else {
      for (int64_t i = 0; i < len; ++i) t[start + i] -= stream[static_cast<size_t>(i)];
    }
  }
}

#else  // no libsodium: every entry point says how to get it

KeyPair make_key_pair() { no_sodium(); }
void wipe(KeyPair& key) { key.secret_key.fill(0); }
Key pairwise_seed(const KeyPair&, const Key&, int64_t) { no_sodium(); }
void add_stream(at::Tensor&, const Key&, int) { no_sodium(); }

#endif

at::Tensor to_fixed_point(const at::Tensor& x, int64_t limit) {
  auto scaled = x.to(at::kDouble).contiguous().mul(std::ldexp(1.0, kFractionBits));
  const double bound = std::ldexp(1.0, 63) / static_cast<double>(std::max<int64_t>(limit, 1));
  const double largest = scaled.numel() == 0 ? 0.0 : scaled.abs().max().item<double>();
  if (!(largest < bound))
    throw Error(fmt::format("secure aggregation: an update element of magnitude {:.3g} does not fit the fixed-point "
                            "range (|x| < {:.3g} for {} participants); the client's training diverged or its "
                            "weight is too large",
                            largest / std::ldexp(1.0, kFractionBits), bound / std::ldexp(1.0, kFractionBits), limit));
  return scaled.round().to(at::kLong);
}

at::Tensor from_fixed_point(const at::Tensor& sum) {
  return sum.to(at::kDouble).div(std::ldexp(1.0, kFractionBits));
}

void add_mod(at::Tensor& target, const at::Tensor& other) {
  TORCH_CHECK(other.numel() == target.numel(), "add_mod: sizes differ");
  at::Tensor o = other.contiguous();
  uint64_t* t = lanes(target);
  const uint64_t* p = lanes(o);
  for (int64_t i = 0; i < target.numel(); ++i) t[i] += p[i];  // unsigned: wraps mod 2^64 by definition
}

at::Tensor key_rows(const std::vector<int64_t>& ids, const std::vector<Key>& keys, int64_t per_row) {
  TORCH_CHECK(static_cast<int64_t>(keys.size()) == static_cast<int64_t>(ids.size()) * per_row,
              "key_rows: ", keys.size(), " keys for ", ids.size(), " rows of ", per_row);
  const int64_t width = 1 + per_row * kKeyBytes;
  auto t = torch::zeros({static_cast<int64_t>(ids.size()), width}, torch::kLong);
  auto* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < ids.size(); ++i) {
    p[i * width] = ids[i];
    for (int64_t k = 0; k < per_row; ++k) {
      const Key& key = keys[i * per_row + k];
      for (int64_t b = 0; b < kKeyBytes; ++b) p[i * width + 1 + k * kKeyBytes + b] = key[b];
    }
  }
  return t.reshape({-1});
}

void read_key_rows(const at::Tensor& rows, int64_t per_row, std::vector<int64_t>& ids, std::vector<Key>& keys) {
  ids.clear();
  keys.clear();
  if (!rows.defined() || rows.numel() == 0) return;
  const int64_t width = 1 + per_row * kKeyBytes;
  if (rows.scalar_type() != at::kLong || rows.numel() % width != 0)
    throw CommError(fmt::format("secure aggregation: a key message of {} elements is not rows of {}", rows.numel(),
                                width));
  const at::Tensor t = rows.contiguous();
  const auto* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel() / width; ++i) {
    ids.push_back(p[i * width]);
    for (int64_t k = 0; k < per_row; ++k) {
      Key key;
      for (int64_t b = 0; b < kKeyBytes; ++b) {
        const int64_t v = p[i * width + 1 + k * kKeyBytes + b];
        if (v < 0 || v > 255) throw CommError("secure aggregation: a key byte out of range in a key message");
        key[b] = static_cast<uint8_t>(v);
      }
      keys.push_back(key);
    }
  }
}

at::Tensor mask_vector(const KeyPair& mine, int64_t index, const std::vector<Key>& public_keys, int64_t round,
                       const at::Tensor& values, int64_t limit) {
  at::Tensor masked = to_fixed_point(values.reshape({-1}), limit);
  for (int64_t v = 0; v < static_cast<int64_t>(public_keys.size()); ++v) {
    if (v == index) continue;
    add_stream(masked, pairwise_seed(mine, public_keys[static_cast<size_t>(v)], round), index < v ? 1 : -1);
  }
  return masked;
}

void remove_mask(at::Tensor& sum, const Key& seed, int64_t survivor, int64_t dropped) {
  // The survivor added sign(u, v) * stream(s_uv); take it out again.
  add_stream(sum, seed, survivor < dropped ? -1 : 1);
}

SecureAggregationRound::SecureAggregationRound(comm::ProcessGroup& world, int64_t round,
                                               std::vector<int64_t> participants,
                                               const std::function<bool(int64_t)>& hosted, int64_t length)
    : world_(world), round_(round), participants_(std::move(participants)), length_(length) {
  if (!secure_aggregation_available()) no_sodium();
  TORCH_CHECK(std::is_sorted(participants_.begin(), participants_.end()), "participants must be sorted");
  const auto n = static_cast<int64_t>(participants_.size());
  std::vector<Key> mine(static_cast<size_t>(n), Key{});
  for (int64_t i = 0; i < n; ++i) {
    if (!hosted(participants_[i])) continue;
    hosted_keys_[participants_[i]] = make_key_pair();
    mine[static_cast<size_t>(i)] = hosted_keys_[participants_[i]].public_key;
  }
  // Step 1: every public key to everyone (what the server's relay does).
  at::Tensor keys = keys_to_tensor(mine);
  if (world_.size() > 1) world_.all_reduce(keys, comm::ReduceOp::kSum)->wait();
  for (int64_t i = 0; i < n; ++i) public_keys_.push_back(key_at(keys, i));
  added_.assign(static_cast<size_t>(n), false);
  upload_ = torch::zeros({length_}, torch::kLong);
}

SecureAggregationRound::~SecureAggregationRound() {
#ifdef PARATRAIN_HAVE_SODIUM
  // Secret keys live for one round; sodium_memzero is not optimized away.
  for (auto& [client, k] : hosted_keys_) sodium_memzero(k.secret_key.data(), k.secret_key.size());
#endif
}

int64_t SecureAggregationRound::index_of(int64_t client) const {
  auto it = std::lower_bound(participants_.begin(), participants_.end(), client);
  TORCH_CHECK(it != participants_.end() && *it == client, "client ", client, " is not a participant of this round");
  return it - participants_.begin();
}

void SecureAggregationRound::add(int64_t client, const at::Tensor& values) {
  const int64_t u = index_of(client);
  auto key = hosted_keys_.find(client);
  TORCH_CHECK(key != hosted_keys_.end(), "client ", client, " is not hosted on this rank");
  TORCH_CHECK(!added_[static_cast<size_t>(u)], "client ", client, " already added its vector this round");
  TORCH_CHECK(values.numel() == length_, "client ", client, ": ", values.numel(), " elements, expected ", length_);
  add_mod(upload_, mask_vector(key->second, u, public_keys_, round_, values,
                               static_cast<int64_t>(participants_.size())));
  added_[static_cast<size_t>(u)] = true;
}

at::Tensor SecureAggregationRound::aggregate() {
  const auto n = static_cast<int64_t>(participants_.size());
  const int size = world_.size();
  // Step 3: every rank's masked upload to the server, kept apart (the server
  // adds them mod 2^64; the comm layer's signed sums could overflow).
  at::Tensor gathered = world_.rank() == 0 ? torch::empty({size * length_}, torch::kLong) : at::Tensor();
  if (size > 1) {
    world_.gather(gathered, upload_, 0)->wait();
  } else {
    gathered = upload_.clone();
  }
  // Who dropped: every rank flags its hosted participants that added nothing.
  auto missing = torch::zeros({n}, torch::kLong);
  for (const auto& [client, key] : hosted_keys_) {
    const int64_t u = index_of(client);
    if (!added_[static_cast<size_t>(u)]) missing[u] = 1;
  }
  if (size > 1) world_.all_reduce(missing, comm::ReduceOp::kSum)->wait();
  std::vector<int64_t> dropped_index;
  for (int64_t i = 0; i < n; ++i) {
    if (missing[i].item<int64_t>() > 0) {
      dropped_index.push_back(i);
      dropped_.push_back(participants_[i]);
    }
  }
  // Step 4: survivors reveal their seeds with each dropped participant.
  const auto d = static_cast<int64_t>(dropped_index.size());
  at::Tensor seeds;
  if (d > 0) {
    std::vector<Key> rows(static_cast<size_t>(n * d), Key{});
    for (const auto& [client, key] : hosted_keys_) {
      const int64_t u = index_of(client);
      if (!added_[static_cast<size_t>(u)]) continue;
      for (int64_t k = 0; k < d; ++k) {
        rows[static_cast<size_t>(u * d + k)] =
            pairwise_seed(key, public_keys_[static_cast<size_t>(dropped_index[k])], round_);
      }
    }
    seeds = keys_to_tensor(rows);
    if (size > 1) world_.reduce(seeds, 0, comm::ReduceOp::kSum)->wait();
  }
  if (world_.rank() != 0) return at::Tensor();

  at::Tensor sum = torch::zeros({length_}, torch::kLong);
  for (int r = 0; r < size; ++r) {
    received_.push_back(gathered.slice(0, r * length_, (r + 1) * length_).clone());
    add_mod(sum, received_.back());
  }
  for (int64_t u = 0; u < n; ++u) {
    if (missing[u].item<int64_t>() > 0) continue;
    for (int64_t k = 0; k < d; ++k) {
      remove_mask(sum, key_at(seeds, u * d + k), u, dropped_index[k]);
    }
  }
  return from_fixed_point(sum);
}

int64_t SecureAggregationRound::extra_bytes_up_per_client() const {
  return kKeyBytes + length_ * 4 + static_cast<int64_t>(dropped_.size()) * kKeyBytes;
}

int64_t SecureAggregationRound::extra_bytes_down_per_client() const {
  return static_cast<int64_t>(participants_.size()) * kKeyBytes;
}

}  // namespace paratrain::federated

// Client sampling: see sampling.h.
#include "paratrain/federated/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace paratrain::federated {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

std::vector<int64_t> sample_clients(int64_t clients, double fraction, uint64_t seed, int64_t round) {
  const int64_t count = std::clamp<int64_t>(std::llround(fraction * static_cast<double>(clients)), 1, clients);
  std::vector<int64_t> ids(clients);
  std::iota(ids.begin(), ids.end(), 0);
  return sample_from(std::move(ids), count, seed, round);
}

std::vector<int64_t> sample_from(std::vector<int64_t> pool, int64_t count, uint64_t seed, int64_t round) {
  const auto n = static_cast<int64_t>(pool.size());
  count = std::clamp<int64_t>(count, 0, n);
  // A partial Fisher-Yates: the first `count` slots are a uniform sample.
  std::mt19937_64 rng(mix_seed(seed, 0x53414d50, static_cast<uint64_t>(round)));
  for (int64_t i = 0; i < count; ++i) std::swap(pool[i], pool[i + static_cast<int64_t>(rng() % (n - i))]);
  pool.resize(count);
  std::sort(pool.begin(), pool.end());
  return pool;
}

bool client_drops(double probability, uint64_t seed, int64_t round, int64_t client) {
  if (probability <= 0) return false;
  const uint64_t draw = mix_seed(seed ^ 0x44524f50, static_cast<uint64_t>(round), static_cast<uint64_t>(client));
  // The top 53 bits as a uniform double in [0, 1).
  return static_cast<double>(draw >> 11) * 0x1.0p-53 < probability;
}

}  // namespace paratrain::federated

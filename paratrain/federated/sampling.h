// Which clients take part in a round, and which of them fail (simulated
// dropouts): seeded by (run seed, round), so every rank draws the same
// selection without a message and a rerun draws it again. Not the round
// itself (round.h).
#pragma once

#include <cstdint>
#include <vector>

namespace paratrain::federated {

// max(1, round(fraction * clients)) distinct clients, ascending, drawn
// uniformly without replacement for `round`.
std::vector<int64_t> sample_clients(int64_t clients, double fraction, uint64_t seed, int64_t round);

// `count` (capped at pool.size()) distinct ids of `pool`, ascending, drawn
// for `round` by the same stream as sample_clients: with pool = 0..N-1 and
// the same count it returns the same sample. Rounds after a client process
// died sample from the clients still alive.
std::vector<int64_t> sample_from(std::vector<int64_t> pool, int64_t count, uint64_t seed, int64_t round);

// Whether `client` fails to report in `round` when each sampled client fails
// with `probability` independently (federated.dropout).
bool client_drops(double probability, uint64_t seed, int64_t round, int64_t client);

// A 64-bit seed for (seed, a, b): splitmix64 over the three, so nearby
// rounds and clients get unrelated streams.
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b = 0);

}  // namespace paratrain::federated

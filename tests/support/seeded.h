// Rank threads share torch's default generator. A rank that seeds it and then
// draws (to build its copy of a model) must not interleave with another rank
// doing the same, or the copies differ: seed and build under one lock.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <mutex>
#include <utility>

namespace paratrain::testing {

inline std::mutex& default_generator_mutex() {
  static std::mutex mu;
  return mu;
}

// Returns make() run with the default generator seeded to `seed`, one caller
// at a time across the rank threads.
template <class Make>
auto seeded(uint64_t seed, Make&& make) {
  std::lock_guard<std::mutex> lock(default_generator_mutex());
  torch::manual_seed(seed);
  return std::forward<Make>(make)();
}

}  // namespace paratrain::testing

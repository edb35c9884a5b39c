// [profile]: operator profiling over a range of steps (docs/profiling.md).
// The section of TrainConfig (config.h) that configures paratrain/profile/
// through train/loop/step_profiler.h. Each key's type, doc line and range
// check, and the rules between keys, are beside it in profile_section.cpp:
// adding a key is a field here and one line there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace paratrain::train {

/// `[profile]`: which steps and ranks record LibTorch's operator profiler,
/// the step phases and the collectives into `<run_dir>/profile/` (`paratrain
/// trace RUN` draws them, `paratrain profile RUN` sums them up).
struct ProfileConfig {
  /// Optimizer steps to profile: "" (off, no cost), "N" or "A-B" (both ends
  /// included, 1 = the first step).
  std::string steps;
  /// Ranks that record ([] or "all" = every rank); the others take part in
  /// the clock alignment only.
  std::vector<int64_t> ranks;
  bool record_shapes = false;  ///< input shapes of every operator (more overhead)
  bool memory = false;         ///< allocations and frees: a memory counter in the trace
  /// Experiments and tests: rank test_slow_rank (-1 = none) sleeps
  /// test_slow_ms before each step's first forward (a straggler on purpose).
  int64_t test_slow_rank = -1;
  double test_slow_ms = 0.0;  ///< the straggler's sleep per step, in ms
  /// Experiments and tests: rank test_slow_rank computes this many times
  /// slower per example (after each micro-batch it sleeps factor - 1 times
  /// the compute it just did); 1 = off. Heterogeneous ranks on one machine.
  double test_slow_factor = 1.0;
  /// Experiments and tests: every rank sleeps this long per example of each
  /// micro-batch (ms; the slowed rank test_slow_factor times as long): a
  /// compute cost that is linear in the batch and free of the CPU
  /// contention of ranks sharing cores. 0 = off.
  double test_example_ms = 0.0;

  bool operator==(const ProfileConfig&) const = default;
};

/// profile.steps as [first, last], or nullopt when profiling is off. The
/// form was checked when the config was loaded.
std::optional<std::pair<int64_t, int64_t>> profile_step_range(const ProfileConfig& profile);

}  // namespace paratrain::train

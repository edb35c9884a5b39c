// What one profiled rank wrote (<run_dir>/profile/rank_<r>.json): its
// steps, the operator profiler's events, its collectives from the flight
// recorder, and how its clock was aligned with the other ranks'. Every time
// is in microseconds on rank 0's system clock (Note [Profile clocks] in
// clock.h), so the files of all ranks share one timeline.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/profile/clock.h"
#include "paratrain/profile/op_profiler.h"

namespace paratrain::profile {

/// One optimizer step on this rank: from its first micro-batch's request to
/// the end of its optimizer step.
struct StepSpan {
  int64_t step = 0;  ///< the run's step number (1 = the first optimizer step)
  int64_t start_us = 0;
  int64_t end_us = 0;
};

/// One collective as the flight recorder saw it (comm/doctor/flight_recorder.h).
struct CommEvent {
  std::string op;     ///< "all_reduce", "reduce_scatter", "send", ...
  std::string group;  ///< "world", "dp", "tp", ...
  int64_t seq = 0;    ///< the group's sequence number (equal on every member for one call)
  int64_t bytes = 0;  ///< bytes of its (first) tensor
  std::string dtype;  ///< "Float", ...
  int peer = -1;      ///< root, source or destination; -1 when none
  int64_t start_us = 0;
  int64_t end_us = 0;  ///< the step's end when it never finished
  std::string state;   ///< "done", "failed", "in_flight", ...
};

/// What profiling a step range cost on this rank.
struct ProfileOverhead {
  double profiled_step_ms = 0;    ///< mean wall time of the profiled steps
  double unprofiled_step_ms = 0;  ///< mean of as many steps just before them (0: none ran before)
  int64_t unprofiled_steps = 0;   ///< how many steps that mean is over
};

/// One rank's profile.
struct RankProfile {
  int rank = 0;
  int world_size = 1;
  std::string host;
  std::string profiler;      ///< "kineto" or "legacy" (op_profiler.h)
  uint64_t loop_thread = 0;  ///< the profiler's id of the thread that ran the training loop
  ClockAlignment clock;
  std::vector<StepSpan> steps;
  std::vector<OpEvent> events;        ///< operators, phases, memory, GPU kernels; sorted by start
  std::vector<CommEvent> collectives;  ///< sorted by start
  /// "flight recorder" or a sentence saying why there are none.
  std::string collectives_source;
  int64_t dropped_collectives = 0;  ///< left the recorder's ring before they were read
  ProfileOverhead overhead;
};

/// The JSON document of a rank file, and back (ConfigError naming `source` on a malformed one).
nlohmann::json to_json(const RankProfile& profile);
RankProfile rank_profile_from_json(const nlohmann::json& json, const std::string& source);

/// <run_dir>/profile: where the rank files go.
std::filesystem::path profile_dir(const std::filesystem::path& run_dir);
/// Writes <dir>/rank_<r>.json atomically.
void write_rank_profile(const std::filesystem::path& dir, const RankProfile& profile);
/// Every rank file of a run, by rank. ConfigError when there is none,
/// saying how to record one (profile.steps).
std::vector<RankProfile> read_run_profiles(const std::filesystem::path& run_dir);

}  // namespace paratrain::profile

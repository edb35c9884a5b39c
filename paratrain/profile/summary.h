// Where each profiled step's time went, per rank (`paratrain profile RUN`):
// data loading, forward/backward compute, optimizer, communication that
// nothing overlapped (exposed) and that compute overlapped, and idle time;
// the operators with the most self time; and per step the straggler, the
// rank the others waited for. See Note [Where a step's time went] in
// summary.cpp for the definitions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/profile/rank_profile.h"

namespace paratrain::profile {

/// One step of one rank, in milliseconds. data + compute + optimizer +
/// exposed_comm + idle = wall; overlapped_comm is inside compute.
struct StepBreakdown {
  int64_t step = 0;
  int rank = 0;
  double wall_ms = 0;
  double data_ms = 0;             ///< the loop waiting for its batch (and moving it to the device)
  double compute_ms = 0;          ///< operators of forward and backward, not waiting for a collective
  double optimizer_ms = 0;        ///< operators of the optimizer step (and gradient clipping, unscaling)
  double exposed_comm_ms = 0;     ///< collectives in flight while the loop ran no operator
  double overlapped_comm_ms = 0;  ///< collectives in flight while operators ran (hidden by compute)
  double idle_ms = 0;             ///< none of the above: framework overhead, sleeping, untracked work
  int64_t comm_bytes = 0;         ///< bytes of the step's collectives
  int64_t collectives = 0;        ///< how many
};

/// One operator over every profiled step and rank.
struct OpStat {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0;   ///< its time minus the operators it called
  double total_ms = 0;  ///< its time, callees included
};

/// The rank the others waited for in one step.
struct Straggler {
  int64_t step = 0;
  int rank = 0;            ///< the least exposed communication: the others waited for it
  double waited_ms = 0;    ///< the most another rank's exposed communication exceeded the straggler's
  int waiting_rank = -1;   ///< that rank
};

/// A run's profile, summarized.
struct ProfileSummary {
  std::vector<StepBreakdown> steps;   ///< by step, then rank
  std::vector<OpStat> top_ops;        ///< by self time, largest first
  std::vector<Straggler> stragglers;  ///< one per step profiled on two or more ranks
  std::vector<RankProfile> ranks;     ///< what was read (events dropped), for the header lines
};

/// Summarizes the rank files of one run; keeps the `top` operators.
ProfileSummary summarize(std::vector<RankProfile> ranks, int top = 15);
/// The summary as text: one table per step, the top operators, stragglers,
/// and how the profile was taken (profiler, clocks, overhead).
std::string format_summary(const ProfileSummary& summary);
/// The same as JSON, for scripts.
nlohmann::json summary_json(const ProfileSummary& summary);

}  // namespace paratrain::profile

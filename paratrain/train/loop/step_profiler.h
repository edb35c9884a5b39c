// The loop's profiling part (profile.*, docs/profiling.md): it owns the
// cadence (which steps, which ranks) and the bookkeeping around a
// profile/StepRecorder: the clock alignment at the start of the run, the
// unprofiled steps before the range that the overhead is measured against,
// and the rank file written when the range ends (or the run does inside
// it). With profile.steps = "" every call returns at once.
// Internal to paratrain/train.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "paratrain/profile/clock.h"
#include "paratrain/train/trainer.h"

namespace paratrain::profile {
class StepRecorder;
}

namespace paratrain::train {

class StepProfiler {
 public:
  /// Collective over the world when profile.steps is set (clock alignment).
  explicit StepProfiler(Trainer::State& s);
  ~StepProfiler();

  /// Around step `step` (1 = the run's first optimizer step) on every rank.
  void begin_step(int64_t step);
  void end_step(int64_t step);
  /// The run ended: writes a range it ended inside.
  void finish();

 private:
  void write();

  Trainer::State& s_;
  std::optional<std::pair<int64_t, int64_t>> range_;
  bool this_rank_ = false;
  profile::ClockAlignment clock_;
  std::unique_ptr<profile::StepRecorder> recorder_;
  std::chrono::steady_clock::time_point step_start_;
  std::vector<double> before_ms_, during_ms_;  // step wall times before and inside the range
};

}  // namespace paratrain::train

// One rank's recording of a range of steps: the operator profiler started
// and stopped around it, each step's span, and the collectives the flight
// recorder saw, read at every step's end (before they leave its ring), all
// shifted onto rank 0's clock. The train loop (train/loop/step_profiler.h)
// decides when; this keeps what it sees.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "paratrain/profile/op_profiler.h"
#include "paratrain/profile/rank_profile.h"

namespace paratrain::comm {
class FlightRecorder;
}

namespace paratrain::profile {

/// Who records and with what.
struct StepRecorderOptions {
  int rank = 0;
  int world_size = 1;
  OpProfilerOptions ops;
  ClockAlignment clock;
  /// This rank's flight recorder; null: no collectives (collectives_source says why).
  std::shared_ptr<comm::FlightRecorder> recorder;
  std::string no_recorder_reason = "no flight recorder";
};

class StepRecorder {
 public:
  /// Starts the operator profiler on this thread.
  explicit StepRecorder(StepRecorderOptions options);
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  void begin_step(int64_t step);  ///< marks the start of step `step`
  void end_step(int64_t step);    ///< marks its end and reads the collectives since the last end
  /// Stops the profiler and returns the rank's profile (overhead as given).
  RankProfile finish(ProfileOverhead overhead);

 private:
  void harvest(int64_t now_us);
  int64_t now() const;  // the system clock shifted onto rank 0's

  StepRecorderOptions options_;
  std::unique_ptr<OpProfiler> ops_;
  RankProfile profile_;
  std::optional<StepSpan> open_;
  uint64_t next_record_ = 0;  // the flight recorder's next unread index
};

}  // namespace paratrain::profile

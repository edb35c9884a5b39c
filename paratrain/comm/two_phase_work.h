// TwoPhaseWork: one Work made of two collectives in a row with local work
// between and after them (the 16-bit all-reduce, comm/low_precision_all_reduce.h;
// PowerSGD's P then Q; the int8 wire's all-to-all then all-gather). The
// second collective starts, and the final local work runs, on whichever
// thread first polls or waits and finds the stage before it complete, under
// one lock: so a reducer polling its buckets advances them without blocking.
// A subclass starts its first collective in its constructor and hands it to
// begin(); see Note [Second phases on their own group] in
// data_parallel/ddp/compress_hook.h for where the second one must go.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

class TwoPhaseWork : public Work {
 public:
  void wait(std::chrono::milliseconds timeout) final;
  bool is_completed() final;
  std::optional<Clock::time_point> completed_at() final;

 protected:
  /// The first collective, in flight (a subclass constructor calls it once).
  /// `also`: another work the end waits for too (may be null).
  void begin(WorkHandle first, WorkHandle also = nullptr);
  /// The first collective completed: the local work between, and the second
  /// collective in flight, or null when the work ends here (then after_first
  /// did the final local work itself).
  virtual WorkHandle after_first() = 0;
  /// The second collective (and `also`) completed: the final local work.
  virtual void after_second() = 0;

 private:
  enum class Phase { kFirst, kSecond, kDone };
  void advance_first();  // mutex_ held
  void done();           // mutex_ held

  WorkHandle stage_, also_;
  Phase phase_ = Phase::kFirst;
  std::optional<Clock::time_point> done_at_;
  std::mutex mutex_;
};

}  // namespace paratrain::comm

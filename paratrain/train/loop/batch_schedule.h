// BatchSchedule: which batches this rank trains, step by step, and where
// the ranks meet. The loop asks it for windows: a run of steps between two
// points where every rank stands at the same step. With fixed shares (every
// strategy but asynchronous parameter servers) a window is one step and the
// loader gives its micro-batches. With dynamic batches (Strategy facet
// DynamicBatches: parameter servers in async mode, Note [Dynamic batch
// windows]) a window runs to the next epoch end, checkpoint or
// train.max_steps, and the strategy hands each rank the steps it trains,
// so fast ranks train more of them. Not the loop (fit_loop.h), not the
// data (data/loader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "paratrain/data/dataset.h"
#include "paratrain/train/loop/run_plan.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

// Steps [first, first + steps) of `epoch` (counted within the epoch): after
// them every rank stands at step `end` of the run and at loader batch
// (first + steps) x accumulate of the epoch.
struct Window {
  int64_t epoch = 0;
  int64_t first = 0;
  int64_t steps = 1;
  int64_t end = 0;  // the run's step count after the window
};

// One step this rank trains inside a window.
struct ScheduledStep {
  int64_t in_epoch = 0;  // the step's number within its epoch
  int64_t item = 0;      // the schedule's own handle for its micro-batches
};

class BatchSchedule {
 public:
  virtual ~BatchSchedule() = default;
  // Opens the window that starts at the loader's position and s.step.
  virtual Window open(const RunPlan& plan) = 0;
  // The next step this rank trains in the open window; nullopt when its part
  // of the window is done.
  virtual std::optional<ScheduledStep> next() = 0;
  // Micro-batch `i` of `step` on this rank's device (empty on a rank that
  // trains no data). Throws Error when the data ran out early.
  virtual data::Batch micro_batch(const ScheduledStep& step, int64_t i) = 0;
  // After this rank's part: the loader moves to the window's end.
  virtual void close(const Window& window) = 0;
  // True when every step is a point where all ranks meet (one-step windows).
  virtual bool lockstep() const = 0;
};

// Steps in a dynamic window that starts at step `first` of an epoch of
// `steps_per_epoch` steps, with `step` steps of the run taken: it ends at the
// epoch's end, at `total_steps`, or at the next multiple of
// `checkpoint_every` (0 = none), whichever comes first.
int64_t dynamic_window_steps(int64_t first, int64_t steps_per_epoch, int64_t step, int64_t total_steps,
                             int64_t checkpoint_every);

// The schedule the strategy asks for: dynamic when it implements
// DynamicBatches and turns them on, fixed shares otherwise. Tells the
// strategy the steps this process will take (parameter servers size their
// receives by it).
std::unique_ptr<BatchSchedule> make_batch_schedule(Trainer::State& s, const RunPlan& plan);

}  // namespace paratrain::train

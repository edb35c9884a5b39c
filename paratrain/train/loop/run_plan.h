// RunPlan: how many optimizer steps the run takes and how large they are,
// counted from the loader's position. An in-job recovery changes the world
// size, and with it the batches of an epoch, the global batch and the steps
// left: recount() follows. Also the throughput and ETA of the progress line.
// Not the loop (fit_loop.h) nor which batches a step trains (batch_schedule.h).
#pragma once

#include <chrono>
#include <cstdint>

#include "paratrain/train/callbacks.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

// Optimizer steps of the whole run: whole steps per epoch (an incomplete
// accumulation group is dropped, Note [Accumulation]) over train.epochs,
// capped by train.max_steps.
int64_t planned_steps(const TrainConfig& config, int64_t steps_per_epoch);

struct RunPlan {
  int64_t accumulate = 1;       // micro-batches per optimizer step (train.accumulate)
  int64_t steps_per_epoch = 0;  // of a whole epoch at this world size
  int64_t global_batch = 0;     // examples per optimizer step over the dp ranks
  int64_t total_steps = 0;      // the step the run ends at

  // At the start of fit, from the batch sizes and the loader; recounted when
  // the loader starts inside a survivors' split (a resume after an in-job
  // recovery at another world size).
  explicit RunPlan(const Trainer::State& s);
  // After an in-job recovery: the loader's position in its epoch, at the
  // survivors' batch sizes.
  void recount(const Trainer::State& s);

  // Fewer than `accumulate` batches left in the loader's epoch: it is done
  // (a partial step is dropped).
  bool epoch_done(const Trainer::State& s) const;
  FitInfo fit_info(const Trainer::State& s) const;
};

// Samples per second since fit started and the time to the last step.
class Throughput {
 public:
  explicit Throughput(int64_t first_step) : first_step_(first_step), start_(Clock::now()) {}
  void fill(StepInfo& info, const RunPlan& plan) const;
  double samples_per_second(int64_t step, int64_t global_batch) const;

 private:
  using Clock = std::chrono::steady_clock;
  int64_t first_step_;
  Clock::time_point start_;
};

}  // namespace paratrain::train

// FitLoop: Trainer::fit's loop. It reads as the list of what a step does:
// take the window of steps the batch schedule gives (one step with fixed
// shares), train this rank's steps in it, meet the other ranks (the loss
// over ranks, logs and callbacks, a periodic checkpoint), and at an epoch's
// end evaluate, stop early or go on, and save. Each part owns its cadence
// (run_plan.h, batch_schedule.h, loss_window.h, eval_policy.h,
// checkpoint_policy.h, step_profiler.h, preemption_check.h,
// adaptive_freezing.h, distillation.h, batch_shares.h) and in-job
// recovery tells the loop where to go on (recovery.h). Internal to paratrain/train: users see trainer.h.
#pragma once

#include <memory>

#include "paratrain/train/loop/adaptive_freezing.h"
#include "paratrain/train/loop/batch_schedule.h"
#include "paratrain/train/loop/batch_shares.h"
#include "paratrain/train/loop/checkpoint_policy.h"
#include "paratrain/train/loop/distillation.h"
#include "paratrain/train/loop/moe_routing.h"
#include "paratrain/train/loop/eval_policy.h"
#include "paratrain/train/loop/loss_window.h"
#include "paratrain/train/loop/metrics_logger.h"
#include "paratrain/train/loop/preemption_check.h"
#include "paratrain/train/loop/recovery.h"
#include "paratrain/train/loop/run_plan.h"
#include "paratrain/train/loop/step_profiler.h"
#include "paratrain/train/task.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class FitLoop {
 public:
  FitLoop(Trainer& trainer, Trainer::State& s);
  ~FitLoop();
  TrainResult run();

 private:
  enum class EpochEnd { kNext, kFinished, kRolledBack };

  void start_epoch_if_fresh();
  void log_gpu_memory_peak() const;
  Outcome train_window(const Window& w);
  double take_step(const ScheduledStep& step, int64_t index);
  void report_inside_window(const ScheduledStep& step, int64_t index, const Window& w, int64_t& line_at);
  Outcome meet(const Window& w);
  EpochEnd end_epoch(bool stopping);
  Outcome evaluate(int64_t epoch);
  StepInfo step_info(int64_t step, int64_t epoch, int64_t batch) const;
  void finish();

  Trainer& trainer_;
  Trainer::State& s_;
  TrainResult result_;
  Distillation distill_;  // distill.teacher: wraps the task's loss, so before micro_loss_
  MoeRouting moe_;        // model.moe_experts: the aux losses' weight and the routing records
  LossFn micro_loss_;
  RunPlan plan_;
  LossWindow losses_;
  InJobRecovery recovery_;
  CheckpointPolicy checkpoints_;
  EvalPolicy eval_;
  Throughput throughput_;
  std::unique_ptr<BatchSchedule> schedule_;
  std::shared_ptr<MetricsLogger> logger_;
  StepProfiler profiler_;  // profile.*: collective at construction when on
  PreemptionCheck preemption_;  // train.preempt_signals
  AdaptiveFreezing freezing_;   // freeze.adaptive
  ShareBalancer shares_;        // data.batch_shares
  double applied_lr_ = 0;
};

}  // namespace paratrain::train

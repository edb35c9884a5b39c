// MetricsLogger: the Trainer's reports as a callback (callbacks.h). On
// rank 0, a step whose loss was computed (a log point) becomes a log line
// ("epoch 1/3 step 100/1404 loss ...", unless a progress bar replaces it)
// and a "train" record of metrics.jsonl with the strategy's communication
// and memory figures; an evaluation becomes its line and an "eval" record.
// Records also reach every callback's on_log (TensorBoard). Runs first among
// the callbacks, so they see the records of the step they are told about.
// Not the loss reduction (loss_window.h) nor the cadence (the loop).
#pragma once

#include "paratrain/train/callbacks.h"
#include "paratrain/train/loop/run_plan.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class MetricsLogger final : public Callback {
 public:
  // `plan` is the loop's, recounted after in-job recoveries.
  MetricsLogger(Trainer::State& s, const RunPlan& plan);
  void on_train_batch_end(const StepInfo& info) override;
  void on_validation_end(const EvalInfo& eval) override;

 private:
  Trainer::State& s_;
  const RunPlan& plan_;
};

}  // namespace paratrain::train

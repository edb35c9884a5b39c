// The loop's distillation part (distill.*; docs/distillation.md): before each
// micro-batch's forward it runs the teacher on the same inputs, and the
// micro-batch loss becomes the distillation loss (Note [Distillation loss] in
// train/distill/distill_loss.h) over the student's output, the teacher's
// logits and the task's loss. At fit start it evaluates the teacher once on
// the test set; at every log point it writes the mean soft and hard parts of
// the loss since the last one, over every rank that computed one ("kind": "distill" in
// metrics.jsonl, distill/soft_loss and distill/hard_loss in TensorBoard).
// Off (no cost, no collective) without distill.teacher. Internal to
// paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "paratrain/train/strategies/strategy.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class Distillation {
 public:
  explicit Distillation(Trainer::State& s);

  /// The teacher's test metrics, logged once (rank 0) and written to
  /// metrics.jsonl ("kind": "teacher"). Collective over dp.
  void evaluate_teacher();
  /// Before a micro-batch's forward: the teacher's logits for it.
  void before_micro_batch(const at::Tensor& inputs);
  /// `task` (the task's loss) as the distillation loss; `task` itself when off.
  LossFn wrap(LossFn task);
  /// At a log point of step `step`: the record of the soft and hard loss
  /// means since the last one. Collective over the world when on.
  void log(int64_t step);

 private:
  Trainer::State& s_;
  at::Tensor teacher_logits_;
  double soft_sum_ = 0, hard_sum_ = 0;
  int64_t micro_batches_ = 0;
};

}  // namespace paratrain::train

// EvalPolicy: when the loop evaluates. Every train.eval_every_epochs epochs
// at the epoch's end, and when the run stops inside an epoch
// (train.max_steps), so its last state has a test figure; never with
// train.eval_every_epochs = 0. Not the evaluation itself (Trainer::evaluate)
// nor its report (metrics_logger.h).
#pragma once

#include <cstdint>

#include "paratrain/train/config/config.h"

namespace paratrain::train {

class EvalPolicy {
 public:
  explicit EvalPolicy(const TrainConfig& config) : every_(config.train.eval_every_epochs) {}
  // At the end of `epoch` (`epoch_done`: its last whole step taken) or at a
  // stop inside it (`stopping`).
  bool due(int64_t epoch, bool epoch_done, bool stopping) const {
    if (every_ <= 0) return false;
    return epoch_done ? (epoch + 1) % every_ == 0 : stopping;
  }

 private:
  int64_t every_;
};

}  // namespace paratrain::train

// The loop's adaptive-freezing part (freeze.adaptive; docs/freezing.md):
// it sums each layer's squared gradient after every step's backward, and
// every freeze.check_every_steps, where all ranks meet, reduces those sums
// over the world and asks the AutoFreeze criterion (train/freeze/
// auto_freeze.h) whether a longer prefix of layers may freeze. When one does,
// it saves a checkpoint of the step and rebuilds the strategy with the larger
// frozen set from it (train/freeze/refreeze.h): the same decision on every
// rank, logged with the step, in metrics.jsonl ("kind": "freeze") and
// TensorBoard. Off (no cost, no collective) without freeze.adaptive.
// Internal to paratrain/train.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "paratrain/train/freeze/auto_freeze.h"
#include "paratrain/train/loop/checkpoint_policy.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class AdaptiveFreezing {
 public:
  explicit AdaptiveFreezing(Trainer::State& s);

  /// After a step's last backward, before its optimizer step: this rank's
  /// share of each layer's squared gradient norm, held until step_done().
  void observe_gradients();
  /// After the optimizer step: the observed sums count unless the loss
  /// scaler skipped the step (a verdict every rank shares).
  void step_done(bool stepped);
  /// At a meeting point: a check is due at this step. Collective when it
  /// is: reduces the sums, decides, and (when a prefix grows) saves through
  /// `checkpoints` and rebuilds. Returns kRolledBack when the save was
  /// recovered by a rollback (in-job recovery), as CheckpointPolicy::save.
  Outcome maybe_freeze(CheckpointPolicy& checkpoints, int64_t total_steps);

 private:
  // Reduces the interval's sums over the world: G_l of every layer.
  std::vector<double> interval_norms();
  // The records of a check: each layer's norm and change; the decision.
  void log_check(const std::vector<double>& norms) const;
  void log_decision(const std::vector<int>& fresh, const std::vector<std::string>& modules) const;

  Trainer::State& s_;
  std::optional<AutoFreeze> criterion_;
  std::map<std::string, int> layer_of_;  // parameter name -> layer index
  at::Tensor pending_;                   // this step's squared gradient sums per layer (float64, on the device)
  at::Tensor sums_;                      // the interval's, over the steps taken
};

}  // namespace paratrain::train

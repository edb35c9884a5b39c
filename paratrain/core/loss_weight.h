// The weight of a micro-batch's loss in the loss a step differentiates.
//
// Note [The weight of a micro-batch's loss]
// A training step's backward differentiates a sum of micro-batch losses,
// each a loss function's value times a weight: the Trainer multiplies by the
// loss scale (precision.loss_scale), divides by the micro-batches of an
// accumulation (train.accumulate) and weights unequal shares (data.
// batch_shares); a pipeline then weights each of its own micro-batches by
// its share of the rows. A term a layer adds to the loss from inside the
// model (the MoE load-balancing loss: Note [Aux losses in backward] in
// moe/moe.h) must get the same weight, yet under a pipeline it is computed
// on a stage that never sees the loss function. So the weight is a value
// of this thread, set by whoever knows it while the micro-batch's forward
// runs: such a layer reads it in its forward and gives its term that
// gradient in backward. Unset (no scope open): nobody injects anything, and
// a program adds its layers' terms to its loss itself.
#pragma once

#include <optional>

namespace paratrain::core {

/// The weight of the loss of the micro-batch whose forward runs on this
/// thread, if a LossWeightScope is open.
std::optional<double> loss_weight();

/// Sets loss_weight() on this thread until destroyed (scopes nest; the
/// previous value comes back).
class LossWeightScope {
 public:
  explicit LossWeightScope(double weight);
  ~LossWeightScope();
  LossWeightScope(const LossWeightScope&) = delete;
  LossWeightScope& operator=(const LossWeightScope&) = delete;

 private:
  std::optional<double> previous_;
};

}  // namespace paratrain::core

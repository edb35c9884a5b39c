// The loop's mixture-of-experts part (model.moe_experts; docs/moe.md): each
// MoE layer gives its load-balancing loss the gradient of
// model.moe_aux_loss x that loss as a term of the training loss (Note [Aux
// losses in backward] in moe/moe.h): the loop says, for each micro-batch,
// what weight the micro-batch's loss has (a core::LossWeightScope), and a
// pipeline
// scales it by its own micro-batches. At every log point a "moe" record in
// metrics.jsonl gives each layer's routing since the last one: the
// (token, choice) pairs each expert kept, the pairs dropped at capacity,
// the tokens routed, the capacity and the mean aux loss. The counts are
// over the data-parallel group already (every rank holds the same); under a
// pipeline each stage holds its own layers, summed over the stages first.
// Off (no cost) for a dense model. Internal to paratrain/train.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/moe/moe.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class MoeRouting {
 public:
  explicit MoeRouting(Trainer::State& s);

  /// At a log point of step `step`: the record of the routing since the
  /// last one (written by the main rank). Collective over the pipeline's
  /// stages.
  void log(int64_t step);

 private:
  Trainer::State& s_;
  std::vector<std::string> names_;                 // the model's MoE layers, in model order
  std::vector<std::shared_ptr<moe::Moe>> local_;   // per name: this rank's layer, or null (another stage's)
  int64_t experts_ = 0;
};

}  // namespace paratrain::train

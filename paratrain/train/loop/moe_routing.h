// The loop's mixture-of-experts part (model.moe_experts; docs/moe.md): the
// training loss gains model.moe_aux_loss times each MoE layer's
// load-balancing loss of the forward just run, and at every log point a
// "moe" record in metrics.jsonl gives each layer's routing since the last
// one: the (token, choice) pairs each expert kept, the pairs dropped at
// capacity, the tokens routed and the capacity. The counts are over the
// data-parallel group already (every rank holds the same), so the main rank
// writes them without a collective. Off (no cost) for a dense model.
// Internal to paratrain/train.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/train/strategies/strategy.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class MoeRouting {
 public:
  explicit MoeRouting(Trainer::State& s);

  /// `loss` plus the aux losses; `loss` itself for a dense model.
  LossFn wrap(LossFn loss);
  /// At a log point of step `step`: the record of the routing since the
  /// last one (main rank).
  void log(int64_t step);

 private:
  struct Totals {
    std::vector<int64_t> load;
    int64_t dropped = 0, tokens = 0, capacity = 0, forwards = 0;
  };
  Trainer::State& s_;
  std::vector<std::string> names_;  // the layers' module names, in model order
  std::vector<Totals> totals_;
};

}  // namespace paratrain::train

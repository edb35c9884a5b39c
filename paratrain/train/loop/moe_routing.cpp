// The loop's mixture-of-experts part (moe_routing.h).
#include "paratrain/train/loop/moe_routing.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "paratrain/models/gpt.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {
MoeRouting::MoeRouting(Trainer::State& s) : s_(s) {
  if (s.config.model.moe_experts == 0) return;
  for (const auto& [name, layer] : models::moe_layers(*s.strategy->module())) {
    names_.push_back(name);
    totals_.push_back({std::vector<int64_t>(static_cast<size_t>(layer->options().experts), 0)});
  }
}

LossFn MoeRouting::wrap(LossFn loss) {
  if (names_.empty()) return loss;
  return [this, loss = std::move(loss), weight = s_.config.model.moe_aux_loss](const at::Tensor& output,
                                                                              const at::Tensor& targets) {
    at::Tensor total = loss(output, targets);
    const auto layers = models::moe_layers(*s_.strategy->module());
    for (size_t i = 0; i < layers.size() && i < totals_.size(); ++i) {
      const auto& layer = layers[i].second;
      if (weight != 0) total = total + weight * layer->aux_loss().to(total.device());
      const moe::RoutingStats& stats = layer->stats();
      Totals& t = totals_[i];
      for (size_t e = 0; e < t.load.size() && e < stats.load.size(); ++e) t.load[e] += stats.load[e];
      t.dropped += stats.dropped;
      t.tokens += stats.tokens;
      t.capacity = stats.capacity;
      ++t.forwards;
    }
    return total;
  };
}

void MoeRouting::log(int64_t step) {
  if (names_.empty() || totals_.front().forwards == 0) return;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < names_.size(); ++i) {
    Totals& t = totals_[i];
    layers.push_back({{"layer", names_[i]}, {"load", t.load}, {"dropped", t.dropped}, {"tokens", t.tokens},
                      {"capacity", t.capacity}, {"forwards", t.forwards}});
    t = Totals{std::vector<int64_t>(t.load.size(), 0)};
  }
  if (s_.is_main()) s_.log_record({{"kind", "moe"}, {"step", step}, {"layers", std::move(layers)}});
}

}  // namespace paratrain::train

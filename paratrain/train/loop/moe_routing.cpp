// The loop's mixture-of-experts part (moe_routing.h).
#include "paratrain/train/loop/moe_routing.h"

#include <torch/torch.h>

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/models/gpt.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

MoeRouting::MoeRouting(Trainer::State& s) : s_(s) {
  const ModelConfig& m = s.config.model;
  if (m.moe_experts == 0) return;
  experts_ = m.moe_experts;
  // Every MoE block of the GPT (models/gpt.h: every moe_every-th block's
  // MLP), whichever stage holds it.
  for (int64_t i = 0; i < m.layers; ++i) {
    if ((i + 1) % m.moe_every == 0) names_.push_back(fmt::format("blocks.{}.mlp", i));
  }
  local_.resize(names_.size());
  for (const auto& [name, layer] : models::moe_layers(*s.strategy->module())) {
    const auto at = std::find(names_.begin(), names_.end(), name);
    if (at == names_.end())  // its routing would go unlogged: the GPT's names are the records' keys
      throw Error(fmt::format("MoE layer '{}' is not one of the GPT's MoE blocks ({} of them, blocks.<i>.mlp)", name,
                              names_.size()));
    local_[static_cast<size_t>(at - names_.begin())] = layer;
    layer->set_aux_loss_weight(m.moe_aux_loss);
    layer->take_totals();  // not the forwards that built the model (a pipeline's shape probe)
  }
}

void MoeRouting::log(int64_t step) {
  if (names_.empty()) return;
  // Per layer: forwards, tokens, capacity, dropped, aux loss sum, load[E].
  const int64_t width = 5 + experts_;
  at::Tensor table = at::zeros({static_cast<int64_t>(names_.size()), width}, at::kDouble);
  for (size_t i = 0; i < local_.size(); ++i) {
    if (!local_[i]) continue;
    const moe::RoutingTotals t = local_[i]->take_totals();
    auto row = table[static_cast<int64_t>(i)];
    row[0] = static_cast<double>(t.forwards);
    row[1] = static_cast<double>(t.tokens);
    row[2] = static_cast<double>(t.capacity);
    row[3] = static_cast<double>(t.dropped);
    if (t.aux_loss_sum.defined()) row[4] = t.aux_loss_sum.cpu().item<double>();
    for (size_t e = 0; e < t.load.size() && static_cast<int64_t>(e) < experts_; ++e)
      row[5 + static_cast<int64_t>(e)] = static_cast<double>(t.load[e]);
  }
  comm::ProcessGroup& pp = s_.mesh->group(topology::Axis::kPp);
  if (pp.size() > 1) pp.all_reduce(table, comm::ReduceOp::kSum)->wait(s_.timeout());  // each layer on one stage
  if (!s_.is_main() || table[0][0].item<double>() == 0) return;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < names_.size(); ++i) {
    const auto row = table[static_cast<int64_t>(i)];
    const auto count = [&](int64_t j) { return static_cast<int64_t>(row[j].item<double>()); };
    std::vector<int64_t> load;
    for (int64_t e = 0; e < experts_; ++e) load.push_back(count(5 + e));
    const int64_t forwards = count(0);
    layers.push_back({{"layer", names_[i]}, {"load", load}, {"dropped", count(3)}, {"tokens", count(1)},
                      {"capacity", count(2)}, {"forwards", forwards},
                      {"aux_loss", forwards > 0 ? row[4].item<double>() / static_cast<double>(forwards) : 0.0}});
  }
  s_.log_record({{"kind", "moe"}, {"step", step}, {"layers", std::move(layers)}});
}

}  // namespace paratrain::train

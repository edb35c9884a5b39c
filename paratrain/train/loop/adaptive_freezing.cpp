// The loop's adaptive-freezing part (adaptive_freezing.h).
#include "paratrain/train/loop/adaptive_freezing.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/freeze/freezing.h"
#include "paratrain/train/freeze/refreeze.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

AdaptiveFreezing::AdaptiveFreezing(Trainer::State& s) : s_(s) {
  const FreezeConfig& f = s.config.freeze;
  if (!f.adaptive) return;
  // The layers of the model as drawn (every rank draws the same): a pipeline
  // stage or a shard holds only part of it.
  TrainConfig unfrozen = s.config;
  unfrozen.freeze.modules.clear();
  auto model = seeded_model_factory(unfrozen, c10::Device(c10::kCPU), s.model_builder)();
  std::vector<FreezeLayer> layers = freeze_layers(*model, f.modules);
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const auto& module_name : layers[l].modules) {
      for (const auto& p : model->named_parameters()) {
        if (!under_module(p.key(), module_name)) continue;
        layer_of_.emplace(p.key(), static_cast<int>(l));  // the first layer that owns it
      }
    }
  }
  sums_.assign(layers.size(), 0.0);
  criterion_.emplace(std::move(layers), f.threshold, f.max_fraction);
}

// Each element once over the world: a slot's writer (dp rank 0 for a
// replicated tensor, every holder of a disjoint shard piece) adds it.
void AdaptiveFreezing::observe_gradients() {
  if (!criterion_) return;
  torch::NoGradGuard no_grad;
  const double scale = s_.scaler ? s_.scaler->get_scale() : 1.0;
  std::vector<double> step(sums_.size(), 0.0);
  for (const auto& os : checkpoint_slots(*s_.strategy).optimizer_slots()) {
    if (!os.slot.write || !os.param.grad().defined()) continue;
    const auto it = layer_of_.find(os.slot.name);
    if (it == layer_of_.end()) continue;
    step[it->second] += os.param.grad().to(torch::kDouble).pow(2).sum().item<double>() / (scale * scale);
  }
  // A step the loss scaler skips (inf/nan gradients) adds nothing.
  for (double v : step)
    if (!std::isfinite(v)) return;
  for (size_t l = 0; l < step.size(); ++l) sums_[l] += step[l];
}

Outcome AdaptiveFreezing::maybe_freeze(CheckpointPolicy& checkpoints, int64_t total_steps) {
  if (!criterion_) return Outcome::kDone;
  const int64_t step = s_.step;
  if (step <= 0 || step >= total_steps || step % s_.config.freeze.check_every_steps != 0) return Outcome::kDone;
  auto totals = torch::tensor(sums_, torch::kDouble);
  s_.world->all_reduce(totals, comm::ReduceOp::kSum)->wait(s_.timeout());
  std::fill(sums_.begin(), sums_.end(), 0.0);
  std::vector<double> norms(sums_.size());
  for (size_t l = 0; l < norms.size(); ++l) norms[l] = std::sqrt(totals[static_cast<int64_t>(l)].item<double>());
  const std::vector<int> fresh = criterion_->check(norms);
  // Every check, for tuning freeze.threshold: each layer's norm and change.
  nlohmann::json per_layer = nlohmann::json::object();
  for (size_t l = 0; l < norms.size(); ++l) {
    const FreezeLayer& layer = criterion_->layers()[l];
    const auto& changes = criterion_->last_changes();
    per_layer[layer.name] = {{"grad_norm", norms[l]}, {"frozen", layer.frozen}};
    if (l < changes.size() && std::isfinite(changes[l])) per_layer[layer.name]["change"] = changes[l];
  }
  s_.log_record({{"kind", "freeze_check"}, {"step", step}, {"layers", std::move(per_layer)}});
  if (fresh.empty()) return Outcome::kDone;

  std::vector<std::string> modules = s_.config.freeze.modules;
  std::vector<std::string> names;
  int64_t frozen = 0, total = 0;
  for (int l : fresh) {
    const FreezeLayer& layer = criterion_->layers()[static_cast<size_t>(l)];
    names.push_back(layer.name);
    modules.insert(modules.end(), layer.modules.begin(), layer.modules.end());
  }
  for (const auto& layer : criterion_->layers()) {
    total += layer.numel;
    if (layer.frozen) frozen += layer.numel;
  }
  const double fraction = total > 0 ? static_cast<double>(frozen) / static_cast<double>(total) : 0.0;
  const auto& changes = criterion_->last_changes();
  if (s_.is_main()) {
    std::vector<std::string> shown;
    for (int l : fresh) shown.push_back(fmt::format("{} (change {:.3g})", criterion_->layers()[l].name, changes[l]));
    spdlog::info("step {}: freeze.adaptive freezes {}: {:.1f}% of the parameters frozen now", step,
                 fmt::join(shown, ", "), 100.0 * fraction);
  }
  s_.log_record({{"kind", "freeze"}, {"step", step}, {"layers", names}, {"modules", modules},
                 {"frozen_layers", static_cast<int64_t>(std::count_if(criterion_->layers().begin(),
                                                                      criterion_->layers().end(),
                                                                      [](const FreezeLayer& l) { return l.frozen; }))},
                 {"frozen_fraction", fraction}});
  // The state of this step, then the strategy re-planned around the larger
  // frozen set and restored from it.
  if (checkpoints.save(fmt::format("freezing {}", fmt::join(names, ", "))) == Outcome::kRolledBack)
    return Outcome::kRolledBack;
  checkpoints.finish();
  const auto path = checkpoint::checkpoint_dir(s_.run_dir, step);
  refreeze(s_, std::move(modules), path);
  return Outcome::kDone;
}

}  // namespace paratrain::train

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
#include "paratrain/train/rng_guard.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

AdaptiveFreezing::AdaptiveFreezing(Trainer::State& s) : s_(s) {
  const FreezeConfig& f = s.config.freeze;
  if (!f.adaptive) return;
  // The layers of the model as drawn (every rank draws the same): a pipeline
  // stage or a shard holds only part of it. The draw reseeds the generator;
  // the guard puts the run's stream (restored by a resume) back.
  std::shared_ptr<models::Model> model;
  {
    CpuRngGuard keep_rng;
    TrainConfig unfrozen = s.config;
    unfrozen.freeze.modules.clear();
    model = seeded_model_factory(unfrozen, c10::Device(c10::kCPU), s.model_builder)();
  }
  std::vector<FreezeLayer> layers = freeze_layers(*model, f.modules);
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const auto& module_name : layers[l].modules) {
      for (const auto& p : model->named_parameters()) {
        if (!under_module(p.key(), module_name)) continue;
        layer_of_.emplace(p.key(), static_cast<int>(l));  // the first layer that owns it
      }
    }
  }
  const auto options = at::TensorOptions().dtype(at::kDouble).device(s.device);
  pending_ = at::zeros({static_cast<int64_t>(layers.size())}, options);
  sums_ = at::zeros({static_cast<int64_t>(layers.size())}, options);
  criterion_.emplace(std::move(layers), f.threshold, f.max_fraction);
}

// Each element once over the world: a slot's writer (dp rank 0 for a
// replicated tensor, every holder of a disjoint shard piece) adds it.
// Summed on the device, read at checks only.
void AdaptiveFreezing::observe_gradients() {
  if (!criterion_) return;
  torch::NoGradGuard no_grad;
  const double scale = s_.scaler ? s_.scaler->get_scale() : 1.0;
  pending_.zero_();
  for (const auto& os : checkpoint_slots(*s_.strategy).optimizer_slots()) {
    if (!os.slot.write || !os.param.grad().defined()) continue;
    const auto it = layer_of_.find(os.slot.name);
    if (it == layer_of_.end()) continue;
    pending_[it->second] += os.param.grad().to(at::kDouble).pow(2).sum() / (scale * scale);
  }
}

void AdaptiveFreezing::step_done(bool stepped) {
  if (criterion_ && stepped) sums_ += pending_;
}

std::vector<double> AdaptiveFreezing::interval_norms() {
  at::Tensor totals = sums_.to(at::kCPU).clone();
  s_.world->all_reduce(totals, comm::ReduceOp::kSum)->wait(s_.timeout());
  sums_.zero_();
  std::vector<double> norms(static_cast<size_t>(totals.numel()));
  for (size_t l = 0; l < norms.size(); ++l) norms[l] = std::sqrt(totals[static_cast<int64_t>(l)].item<double>());
  return norms;
}

void AdaptiveFreezing::log_check(const std::vector<double>& norms) const {
  // Every check, for tuning freeze.threshold: each layer's norm, its change
  // and whether it is frozen after this check.
  nlohmann::json per_layer = nlohmann::json::object();
  const auto& changes = criterion_->last_changes();
  for (size_t l = 0; l < norms.size(); ++l) {
    const FreezeLayer& layer = criterion_->layers()[l];
    per_layer[layer.name] = {{"grad_norm", norms[l]}, {"frozen", layer.frozen}};
    if (l < changes.size() && std::isfinite(changes[l])) per_layer[layer.name]["change"] = changes[l];
  }
  s_.log_record({{"kind", "freeze_check"}, {"step", s_.step}, {"layers", std::move(per_layer)}});
}

void AdaptiveFreezing::log_decision(const std::vector<int>& fresh, const std::vector<std::string>& modules) const {
  std::vector<std::string> names, shown;
  for (int l : fresh) {
    names.push_back(criterion_->layers()[l].name);
    shown.push_back(fmt::format("{} (change {:.3g})", names.back(), criterion_->last_changes()[l]));
  }
  int64_t frozen = 0, total = 0, frozen_layers = 0;
  for (const auto& layer : criterion_->layers()) {
    total += layer.numel;
    if (!layer.frozen) continue;
    frozen += layer.numel;
    ++frozen_layers;
  }
  const double fraction = total > 0 ? static_cast<double>(frozen) / static_cast<double>(total) : 0.0;
  if (s_.is_main()) {
    spdlog::info("step {}: freeze.adaptive freezes {}: {:.1f}% of the parameters frozen now", s_.step,
                 fmt::join(shown, ", "), 100.0 * fraction);
  }
  s_.log_record({{"kind", "freeze"}, {"step", s_.step}, {"layers", names}, {"modules", modules},
                 {"frozen_layers", frozen_layers}, {"frozen_fraction", fraction}});
}

Outcome AdaptiveFreezing::maybe_freeze(CheckpointPolicy& checkpoints, int64_t total_steps) {
  if (!criterion_) return Outcome::kDone;
  const int64_t step = s_.step;
  if (step <= 0 || step >= total_steps || step % s_.config.freeze.check_every_steps != 0) return Outcome::kDone;
  const std::vector<double> norms = interval_norms();
  const std::vector<int> fresh = criterion_->check(norms);
  log_check(norms);
  if (fresh.empty()) return Outcome::kDone;

  std::vector<std::string> modules = s_.config.freeze.modules;
  for (int l : fresh) {
    for (const auto& m : criterion_->layers()[l].modules)
      if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  }
  log_decision(fresh, modules);
  // The state of this step, recorded with the larger frozen set (a resume
  // from it freezes as this run does from here), then the strategy
  // re-planned around that set and restored from it.
  const std::vector<std::string> before = std::exchange(s_.config.freeze.modules, modules);
  const Outcome saved = checkpoints.save(fmt::format("freezing {}", fmt::join(modules, ", ")));
  s_.config.freeze.modules = before;
  if (saved == Outcome::kRolledBack) return Outcome::kRolledBack;
  checkpoints.finish();
  refreeze(s_, std::move(modules), checkpoint::checkpoint_dir(s_.run_dir, step));
  return Outcome::kDone;
}

}  // namespace paratrain::train

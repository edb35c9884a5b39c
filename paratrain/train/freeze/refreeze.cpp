// refreeze, freeze_layers, checkpoint_frozen_modules (refreeze.h).
#include "paratrain/train/freeze/refreeze.h"

#include <torch/torch.h>

#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/freeze/freezing.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

std::vector<FreezeLayer> freeze_layers(models::Model& model, const std::vector<std::string>& frozen) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>>> groups;
  const auto layers = model.layers();
  if (!layers.empty()) {
    for (const auto& layer : layers) groups.emplace_back(layer.name, layer.modules);
  } else {
    for (const auto& child : model.named_children()) {
      if (!child.value()->parameters().empty()) groups.push_back({child.key(), {{child.key(), child.value()}}});
    }
  }
  std::vector<FreezeLayer> out;
  std::set<const void*> counted;  // a tensor two layers share counts once, for the first
  for (const auto& [name, modules] : groups) {
    FreezeLayer layer{name, {}, 0, true};
    for (const auto& [module_name, module] : modules) {
      if (module->parameters().empty()) continue;  // dropout: nothing to freeze, and no name freeze.modules takes
      layer.modules.push_back(module_name);
      bool covered = false;
      for (const auto& f : frozen) covered = covered || under_module(module_name, f);
      layer.frozen = layer.frozen && covered;
      for (const auto& p : module->parameters())
        if (counted.insert(p.unsafeGetTensorImpl()).second) layer.numel += p.numel();
    }
    if (layer.modules.empty()) continue;  // a layer without parameters trains nothing
    out.push_back(std::move(layer));
  }
  return out;
}

void refreeze(Trainer::State& s, std::vector<std::string> modules, const std::filesystem::path& checkpoint) {
  s.config.freeze.modules = std::move(modules);
  // The old optimizer's tensors are the old strategy's: both go first. The
  // load restores the loss scaler's scale too.
  s.optimizer.reset();
  s.strategy.reset();
  build_model_and_optimizer(s);
  load_training_checkpoint(checkpoint, *s.strategy, *s.optimizer, s.scaler.get());
  s.strategy->module()->train();
}

std::vector<std::string> checkpoint_frozen_modules(const std::filesystem::path& checkpoint) {
  const auto index = checkpoint::read_index(checkpoint);
  const auto it = index.metadata.find("extra.freeze.modules");
  if (it == index.metadata.end()) return {};
  try {
    return nlohmann::json::parse(it->second).get<std::vector<std::string>>();
  } catch (const std::exception&) {
    throw CheckpointError(fmt::format("checkpoint {}: freeze.modules = '{}' is not a list of module names",
                                      checkpoint.string(), it->second));
  }
}

}  // namespace paratrain::train

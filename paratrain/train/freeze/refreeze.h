// Freezing more of a running model: the strategy is rebuilt with the new
// frozen set and restored from a checkpoint of the current step, so every
// strategy re-plans its buckets, shards, units and pipeline backward by the
// same rule as at the start (Note [What freezing saves]). Internal to
// paratrain/train: adaptive freezing (train/loop/adaptive_freezing.h) and a
// resume that finds a larger frozen set in its checkpoint use it.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "paratrain/train/freeze/auto_freeze.h"
#include "paratrain/train/trainer.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train {

/// The model's layers in forward order for adaptive freezing: Model::layers()
/// (each with the modules it owns; a program's Sequential: its children), or
/// the top-level modules when the model cannot be cut (a program's own
/// module, in registration order). `frozen`:
/// freeze.modules, which marks a layer frozen when it covers all its modules.
std::vector<FreezeLayer> freeze_layers(models::Model& model, const std::vector<std::string>& frozen);

/// Sets s.config.freeze.modules to `modules`, rebuilds the strategy and the
/// optimizer and loads `checkpoint` into them (and the loss scaler). Collective.
void refreeze(Trainer::State& s, std::vector<std::string> modules, const std::filesystem::path& checkpoint);

/// freeze.modules recorded in the checkpoint at `checkpoint` (the frozen set
/// it was saved with; empty when none). Adaptive runs resume with it.
std::vector<std::string> checkpoint_frozen_modules(const std::filesystem::path& checkpoint);

}  // namespace paratrain::train

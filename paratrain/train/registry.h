// The registry of user models and datasets: a program that links paratrain
// registers a factory under a name, and `model.kind` / `data.dataset` in a
// TrainConfig may then name it like a built-in ("mlp", "fashion_mnist").
// Not a plugin loader: registration happens in the user's own main().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/user_module.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train {

// ModelBuilder (user_module.h) builds the model from the config: called once
// per rank under the run's seed, like the built-in models; every rank must
// build the same architecture. any_module() makes one from any module.
/// Builds the train and test sets. Every rank calls it and must get the same
/// rows in the same order (the sampler splits them); targets are int64 class
/// labels [N] and the model returns logits [N, classes] (classification loss).
using DatasetBuilder = std::function<Datasets(const TrainConfig&)>;

/// Registers (or replaces) `name`. Throws ConfigError for an empty name or
/// for a built-in name ("mlp", "cnn", "gpt"; "fashion_mnist", "synthetic",
/// "text"), which would silently change what existing configs mean.
void register_model(const std::string& name, ModelBuilder factory);
void register_dataset(const std::string& name, DatasetBuilder factory);

/// nullptr when nothing is registered under `name`.
const ModelBuilder* find_model(std::string_view name);
const DatasetBuilder* find_dataset(std::string_view name);

/// Built-in names first, then registered ones (sorted): what the config
/// accepts for model.kind / data.dataset.
std::vector<std::string> model_kinds();
std::vector<std::string> dataset_names();

}  // namespace paratrain::train

// Internal to paratrain/checkpoint: how each torch::optim optimizer's per-parameter
// state maps to named tensors ("momentum_buffer", "exp_avg", ...) and back.
// Adding an optimizer = one OptimizerStateIo in optimizer_state.cpp.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include "paratrain/core/compat.h"

namespace paratrain::checkpoint {

struct OptimizerStateIo {
  std::string kind;  // "sgd", "adam", "adamw": stored in the metadata
  // One parameter's state as (field, tensor) pairs.
  std::function<std::vector<std::pair<std::string, at::Tensor>>(const torch::optim::OptimizerParamState&)> save;
  // Rebuilds one parameter's state from its fields, checking names and
  // shapes; throws CheckpointError naming `prefix + field` and `file`.
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(
      const std::map<std::string, at::Tensor>& fields, const at::Tensor& param,
      const torch::optim::OptimizerOptions& group_options, const std::string& prefix, const std::string& file)>
      load;
  // Hyper-parameters of every param group, for the record.
  std::function<nlohmann::json(const torch::optim::Optimizer&)> options_json;
  // Fields that are one value per parameter (Adam's "step"), not one per
  // element: sharded checkpoints store them once, whole, instead of cutting
  // them like the parameter.
  std::vector<std::string> scalar_fields = {};

  bool is_scalar_field(const std::string& field) const {
    return std::find(scalar_fields.begin(), scalar_fields.end(), field) != scalar_fields.end();
  }
};

// The adapter for `optimizer`'s concrete type; CheckpointError if unsupported.
const OptimizerStateIo& optimizer_state_io(const torch::optim::Optimizer& optimizer, const std::string& file);

// The key torch::optim uses for a parameter in Optimizer::state().
compat::OptimizerStateKey optimizer_state_key(const at::Tensor& param);

}  // namespace paratrain::checkpoint

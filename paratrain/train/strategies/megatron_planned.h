// A model other than the GPT in the megatron strategy: split by
// parallel.tp_plan (parallelize/plan.h), and the check that the plan gives
// the whole output on every tp rank (Note [A planned model's output]).
// Internal to paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor_parallel/context.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/train/config/config.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train::strategies {

struct PlannedModel {
  // The split model, inside activation checkpointing's wrapper when the run
  // checkpoints activations.
  std::shared_ptr<models::Model> model;
  torch::OrderedDict<std::string, tensor_parallel::ShardSpec> layout;
  // Megatron-SP: the trainable parameters whose gradients are summed over tp.
  std::vector<at::Tensor> sequence_parallel_params;
};

/// parallel.tp_plan applied to `full` (the model as built from the run's
/// seed, so the shards are one process's weights), `frozen` (names) kept
/// frozen. A rule or module the plan names wrongly is a ConfigError.
PlannedModel plan_model(const TrainConfig& config, const std::shared_ptr<models::Model>& full,
                        const std::set<std::string>& frozen, const tensor_parallel::TpContext& tp);

/// After the first forward: every planned layer ran at its site, and `out`
/// is the same on every tp rank (collective over `tp`). ConfigError
/// otherwise, saying how to fix the plan.
void check_planned_output(torch::nn::Module& model, const at::Tensor& out, comm::ProcessGroup& tp,
                          std::chrono::milliseconds timeout);

}  // namespace paratrain::train::strategies

// Freezing in the megatron strategy (Note [Freezing in the megatron
// strategy] in megatron_freeze.cpp): the frozen set carried from the whole
// model to its tensor-parallel split. Internal to paratrain/train.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace paratrain::train::strategies {

/// The names of `full`'s parameters that freeze.modules froze.
std::set<std::string> frozen_names(torch::nn::Module& full);

/// Freezes `split`'s parameters of those names (the split model names its
/// shards as the whole model's). Error naming any it does not have.
void keep_frozen(torch::nn::Module& split, const std::set<std::string>& frozen);

/// `params` without the frozen ones.
std::vector<at::Tensor> trainable(std::vector<at::Tensor> params);

}  // namespace paratrain::train::strategies

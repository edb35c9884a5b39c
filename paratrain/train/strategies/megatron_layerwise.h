// LARS and LAMB in the megatron strategy: each trust ratio needs the norms of
// the single-process tensor, whose elements lie in tp shards, ZeRO/FSDP
// pieces over the replicas, or whole on every tp rank (Note [LARS and LAMB
// across tensor-parallel shards] in megatron_layerwise.cpp). Internal to
// paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/ordered_dict.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/train/strategies/strategy.h"

namespace paratrain::train::strategies {

/// `stepped`: what the optimizer steps, each with its tensor's name (whole
/// tp-local tensors, or pieces of them); `layout`: every tensor of this
/// rank's module by name; `replicas` (null unless the pieces are split over
/// them) and `tp` complete the norms on `device` (the module's: every rank
/// of a collective agrees on it, also one that steps nothing). Both groups
/// must outlive the result.
LayerwiseParams tensor_parallel_layerwise_params(
    const std::vector<std::pair<at::Tensor, std::string>>& stepped,
    const torch::OrderedDict<std::string, tensor_parallel::ShardSpec>& layout, comm::ProcessGroup* replicas,
    comm::ProcessGroup& tp, c10::Device device, std::chrono::milliseconds timeout);

}  // namespace paratrain::train::strategies

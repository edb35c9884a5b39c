// Pieces every data-parallel strategy adapter shares: slots of tensors that
// every dp rank holds in full (DDP parameters, buffers everywhere), the check
// that no model-parallel axis is configured, and the cross-entropy step.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "paratrain/data_parallel/ddp/bucket_plan.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/config.h"
#include "paratrain/train/strategy.h"

namespace torch::nn {
class Module;
}

namespace paratrain::train::strategies {

// Slots for the module's buffers, held in full by every rank; written by the
// rank for which `write` is true (dp rank 0).
std::vector<TensorSlot> buffer_slots(torch::nn::Module& module, bool write);
// Slots for parameters and buffers held in full (DDP).
std::vector<TensorSlot> replicated_slots(torch::nn::Module& module, bool write);
// Optimizer slots when the optimizer steps the full parameters (DDP).
std::vector<OptimizerSlot> replicated_optimizer_slots(torch::nn::Module& module, bool write);
// Detached clones of every parameter, by name.
std::vector<std::pair<std::string, at::Tensor>> clone_parameters(torch::nn::Module& module);

// The ddp.* bucket sizes as reducer options (ZeRO buckets like DDP).
ddp::BucketPlanOptions bucket_options(const TrainConfig& config);
// ZeRO and FSDP build on the bucketed reducer: ddp.mode must be "bucketed".
void check_bucketed_mode(const TrainConfig& config, const std::string& strategy);

// Data-parallel strategies run on a mesh whose other axes are 1. Throws
// ConfigError naming the axis and the strategy otherwise.
void require_data_parallel_only(const topology::DeviceMesh& mesh, const std::string& strategy);

}  // namespace paratrain::train::strategies

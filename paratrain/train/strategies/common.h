// Pieces every data-parallel strategy adapter shares: slots of tensors that
// every dp rank holds in full (DDP parameters, buffers everywhere), the check
// that no model-parallel axis is configured, and the cross-entropy step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/data_parallel/ddp/bucket_plan.h"
#include "paratrain/data_parallel/ddp/step_stats.h"
#include "paratrain/models/model.h"
#include "paratrain/moe/expert_parallel.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/strategies/strategy.h"
#include "paratrain/train/strategies/strategy_registry.h"


namespace paratrain::zero {
class ZeroDataParallel;
struct ZeroOptions;
}  // namespace paratrain::zero
namespace paratrain::fsdp {
struct FsdpOptions;
}  // namespace paratrain::fsdp
namespace paratrain::ddp {
struct DdpOptions;
class Int8Compression;
}  // namespace paratrain::ddp

namespace paratrain::train::strategies {

// Slots for the module's buffers, held in full by every rank; written by the
// rank for which `write` is true (dp rank 0).
std::vector<TensorSlot> buffer_slots(torch::nn::Module& module, bool write);
// Slots for the module's frozen parameters (requires_grad false), which
// sharding strategies leave whole on every rank (Note [What freezing saves]
// in train/freeze/freezing.cpp); written by the rank for which `write` is true.
std::vector<TensorSlot> frozen_parameter_slots(torch::nn::Module& module, bool write);
// Slots for parameters and buffers held in full (DDP).
std::vector<TensorSlot> replicated_slots(torch::nn::Module& module, bool write);
// Optimizer slots when the optimizer steps the full parameters (DDP).
std::vector<checkpoint::OptimizerSlot> replicated_optimizer_slots(torch::nn::Module& module, bool write);
// Detached clones of every parameter, by name.
std::vector<std::pair<std::string, at::Tensor>> clone_parameters(torch::nn::Module& module);

// module.parameters() with each tensor once: LibTorch lists a submodule
// registered under two parents (a tied weight) twice, and an optimizer given
// both would step it twice. PyTorch's parameters() lists it once.
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module);

// The ddp.* bucket sizes as reducer options (ZeRO buckets like DDP).
ddp::BucketPlanOptions bucket_options(const TrainConfig& config);
// ZeRO and FSDP build on the bucketed reducer: ddp.mode must be "bucketed".
void check_bucketed_mode(const TrainConfig& config, const std::string& strategy);

// Data-parallel strategies run on a mesh whose other axes are 1. Throws
// ConfigError naming the axis and the strategy otherwise.
void require_data_parallel_only(const topology::DeviceMesh& mesh, const std::string& strategy);

// LayerwiseParams for optimizer params that are pieces of the module's
// parameters: `pieces` pairs each with its slot (name, global shape), in
// optimizer_params() order. Norms are summed over `dp`, each tensor indexed
// by its name's place in module.named_parameters() (the same on every rank).
LayerwiseParams sharded_layerwise_params(comm::ProcessGroup& dp, torch::nn::Module& module,
                                         const std::vector<std::pair<at::Tensor, TensorSlot>>& pieces);

// The reducer's per-step timings as the Trainer reports them.
SyncStats sync_stats(const ddp::StepStats& stats);

// The .grad of each tensor (undefined ones included; unscale skips them).
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params);
// Mixed precision: unscales `grads` (this rank's whole gradients or shards)
// and agrees on inf/nan over `groups`. True when every rank must skip the
// step. No scaler: false, no communication.
bool unscale_found_inf(optim::GradScaler* scaler, const std::vector<at::Tensor>& grads,
                       const std::vector<comm::ProcessGroup*>& groups, std::chrono::milliseconds timeout);
// precision.compute as the dtype an AutocastGuard takes (kFloat = off).
at::ScalarType compute_dtype(const TrainConfig& config);
// model.sync_batchnorm: replaces the model's BatchNorm layers by
// SyncBatchNorm over `dp` (before DDP/ZeRO/FSDP wrap it). No-op when off.
void convert_batchnorm(const TrainConfig& config, models::Model& model, comm::ProcessGroup& dp,
                       std::chrono::milliseconds timeout);

// The engine options every strategy derives alike from the config (zero.stage,
// bucket caps, ddp.find_unused_parameters, ddp.broadcast_buffers) and the
// collective timeout; strategies add what is theirs (compression hooks).
zero::ZeroOptions zero_options(const TrainConfig& config, std::chrono::milliseconds timeout);
ddp::DdpOptions ddp_options(const TrainConfig& config, std::chrono::milliseconds timeout);
// zero.stage = 3: FSDP's units (zero.unit_min_params / unit_modules), gathers
// and offload from the config.
fsdp::FsdpOptions fsdp_options(const TrainConfig& config, std::chrono::milliseconds timeout);

// Rank 0 logs what the int8 gradient wire sends per step against fp32
// (ddp.compression = "int8"; after it is attached).
void log_int8_wire(const ddp::Int8Compression& int8, comm::ProcessGroup& dp);

// The model-state bytes of several ZeRO engines (one per local pipeline
// chunk) added up; optimizer state is the optimizer's own count.
ModelStateBytes zero_chunks_memory(const std::vector<std::unique_ptr<zero::ZeroDataParallel>>& engines,
                                   const torch::optim::Optimizer& optimizer);

// What the ddp, zero and fsdp adapters hold and answer alike: the config, the
// dp group, the model, the data shard, and buffers (replicated, rank 0 writes).
class DataParallelStrategy : public Strategy, public CheckpointSlots, public Telemetry {
 public:
  std::shared_ptr<torch::nn::Module> module() const override { return model_; }
  DataShard data_shard() const override { return {dp_.rank(), dp_.size()}; }

 protected:
  // Checks that the mesh has no model-parallel axis (`strategy` names it).
  DataParallelStrategy(const StrategyContext& context, const std::string& strategy);
  // `params` (the strategy's slots of its sharded parameters) followed by
  // what every replica holds whole: frozen parameters and buffers.
  std::vector<TensorSlot> with_replicated_slots(std::vector<TensorSlot> params) const;

  // parallel.ep > 1: splits the built model's experts over ep groups of dp
  // (moe/expert_parallel.h) before DDP or ZeRO wrap the rest; returns the
  // parameters the wrapper must leave alone (none at ep = 1).
  std::vector<at::Tensor> split_experts();
  // The gradients' global 2-norm clipped to max_norm (torch's
  // clip_grad_norm_ formula), given the dense part's square sum over the
  // whole model (the same on every rank) and the experts' (experts_).
  void clip_with_experts(double dense_square_sum, double max_norm,
                         const std::function<void(double)>& scale_dense);
  // The experts' trainable parameters as full model slots (written in ep
  // group 0); frozen ones are among with_replicated_slots().
  std::vector<TensorSlot> expert_slots() const;
  // full_parameters(): every expert gathered, in the one-process order.
  std::vector<std::pair<std::string, at::Tensor>> whole_parameters();

  TrainConfig config_;
  at::ScalarType compute_;  // precision.compute: autocast dtype of forward and loss
  comm::ProcessGroup& dp_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<moe::ExpertParallel> experts_;  // parallel.ep > 1
};

}  // namespace paratrain::train::strategies

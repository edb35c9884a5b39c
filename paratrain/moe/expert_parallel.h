// Expert parallelism inside data parallelism (parallel.ep): the experts of
// every MoE layer of a model split over groups of `ep` ranks of the
// data-parallel group, as GShard, DeepSpeed-MoE and Megatron-Core lay them
// out. A data-parallel strategy builds the model whole, as one process
// would, then hands it here before it wraps the rest in DDP or ZeRO:
//
//   moe::ExpertParallel experts(*model, dp, /*ep=*/2, timeout);  // collective over dp
//   ddp_options.local_parameters = experts.parameters();         // DDP leaves them alone
//   ... loss.backward(); ddp.finish_backward();
//   experts.reduce_gradients();                                  // over the replicas
//
// Note [Experts in the data-parallel mesh]
// dp ranks [g ep, (g+1) ep) form ep group g; rank j of every ep group holds
// the same experts, [j E/ep, (j+1) E/ep) of each layer, and those dp/ep
// ranks are the expert's replicas. Tokens are routed over the whole dp
// group (Note [Routing as one process would], moe.h) and travel only
// inside the ep group (Note [Expert parallelism by all-to-all]).
// Gradients, for the data-parallel mean of the ranks' losses:
//   - everything but the experts: DDP's (or ZeRO's) mean over dp, as before;
//   - an expert's gradient on its holder sums the losses of its ep group's
//     ranks (their tokens reached it): summed over the replicas and divided
//     by dp it is the one-process gradient (reduce_gradients(), one
//     coalesced all-reduce over the replicas);
//   - the clipping norm adds each expert once: its square summed over the
//     ep group (the replicas hold the same after the reduction).
// Checkpoints name each expert by its global index (experts.5.fc.weight),
// written by its holder in ep group 0; a run at another ep, or one
// process, loads the experts it holds by name, so checkpoints reshard.
// Users: the ddp and zero strategies (the whole model), the megatron
// strategy beside tensor parallelism, and the pipeline and megatron
// strategies' stages (each stage's chunks, Note [Experts in pipeline
// stages] in train/strategies/pipeline_strategy.cpp). Not here: cp with
// experts, ZeRO-3/FSDP sharding the experts, ZeRO in stages (ConfigError).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <chrono>
#include <memory>
#include <unordered_set>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/tensor_slot.h"
#include "paratrain/moe/moe.h"

namespace paratrain::moe {

/// The two groups of Note [Experts in the data-parallel mesh].
struct ExpertGroups {
  std::shared_ptr<comm::ProcessGroup> ep;        ///< this rank's ep group (dp ranks [g ep, (g+1) ep))
  std::shared_ptr<comm::ProcessGroup> replicas;  ///< the dp ranks holding the same experts as this one
};

/// Collective over `dp`: every rank calls it with the same ep. Throws
/// ConfigError when ep does not divide dp's size.
ExpertGroups make_expert_groups(comm::ProcessGroup& dp, int ep);

/// The MoE layers of `model` (every Moe module, in model order) with their
/// module names.
std::vector<std::pair<std::string, std::shared_ptr<Moe>>> find_moe_layers(torch::nn::Module& model);

/// What ExpertParallel requires of `model` at `ep` over `dp_size` ranks:
/// MoE layers whose experts ep divides, and ep dividing dp. Not collective:
/// judged on the whole model, it is the same on every rank (the pipeline
/// strategies check it before any stage splits its own layers). Throws
/// ConfigError saying what to change.
void check_expert_parallel(torch::nn::Module& model, int dp_size, int ep);

/// A model's experts split over ep groups of dp (see the note above).
class ExpertParallel {
 public:
  /// Collective over `dp`. Splits every MoE layer of `model` (built whole,
  /// as one process would) over ep groups and routes its tokens over `dp`;
  /// each expert's replicas start from the first replica's values (as DDP
  /// broadcasts the rest from rank 0).
  /// Throws ConfigError when the model has no MoE layer or ep does not
  /// divide dp or a layer's experts.
  ExpertParallel(torch::nn::Module& model, comm::ProcessGroup& dp, int ep, std::chrono::milliseconds timeout);

  int ep() const { return ep_; }                                  ///< ranks per ep group
  comm::ProcessGroup& ep_group() { return *groups_.ep; }           ///< this rank's ep group
  comm::ProcessGroup& replicas() { return *groups_.replicas; }     ///< the ranks holding this rank's experts
  /// This rank's trainable expert parameters (every layer's), in model
  /// order: what the optimizer steps and reduce_gradients() reduces.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  /// Every expert tensor this rank holds, frozen ones too: what DDP and ZeRO
  /// must leave alone (DdpOptions::local_parameters).
  const std::vector<at::Tensor>& local_parameters() const { return all_; }
  /// Whether `t` is one of local_parameters().
  bool holds(const at::Tensor& t) const;
  /// Whether this rank writes its experts into checkpoints (ep group 0).
  bool writes() const { return groups_.replicas->rank() == 0; }

  /// After a synchronized backward: every expert gradient summed over the
  /// replicas and divided by dp's size. Collective over the replicas.
  void reduce_gradients();
  /// The experts' gradient squares summed over the ep group (each expert
  /// once); collective over it. Add to the dense part's square sum for the
  /// global clipping norm.
  double grad_square_sum();
  /// Multiplies every expert gradient by `coef` (clipping).
  void scale_gradients(double coef);

  /// `slots` with expert tensors written only by writes() (the rest keep
  /// their flag): for model and optimizer slots alike.
  std::vector<TensorSlot> checkpoint_slots(std::vector<TensorSlot> slots) const;
  /// This rank's named parameters with every layer's experts gathered over
  /// the ep group, in the one-process model's order (collective over it).
  std::vector<std::pair<std::string, at::Tensor>> gather(
      const std::vector<std::pair<std::string, at::Tensor>>& local);

 private:
  int ep_;
  int dp_size_;
  std::chrono::milliseconds timeout_;
  ExpertGroups groups_;
  std::vector<std::pair<std::string, std::shared_ptr<Moe>>> layers_;
  std::vector<at::Tensor> params_, all_;
  std::unordered_set<const void*> held_;  // all_'s TensorImpls
};

}  // namespace paratrain::moe

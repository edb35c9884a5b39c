// DistributedDataParallel: data parallelism for a LibTorch module. Replicas
// start identical (parameters and buffers broadcast from rank 0), and every
// loss.backward() returns with gradients averaged over the group, reduced in
// buckets that overlap with backward (reducer.h). The user keeps calling their
// model; a loop needs only step(optimizer) after each backward, the protocol
// ZeRO (zero.h) and FSDP (fsdp.h) share (Note [One wrapper protocol] in
// docs/notes/ddp.md): the constructor and each step() prepare the next
// forward. Not here: the reduction itself (reducer.h), the naive twin (naive.h).
//
//   model->to(device_or_dtype);   // before wrapping, never after
//   DistributedDataParallel ddp(model, group);
//   for (...) {
//     auto loss = loss_fn(model->forward(shard_of_batch), target);
//     optimizer.zero_grad();
//     loss.backward();          // returns with averaged gradients
//     ddp.step(optimizer);      // joins if this rank's loss reached no parameter, steps, prepares the next forward
//   }
#pragma once

#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/module_sync.h"
#include "paratrain/data_parallel/ddp/reducer.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace paratrain::ddp {

/// How DistributedDataParallel reduces and what it keeps in sync.
struct DdpOptions {
  ReducerOptions reducer;  ///< buckets, unused parameters, gradient views, comm hook, timeout
  /// Broadcast buffers (BatchNorm running statistics) from rank 0 in every
  /// prepare_forward(). Costs one small collective per step; without it each
  /// replica's running statistics drift apart, seeing only its own shard.
  bool broadcast_buffers = true;
  /// Parameters each rank holds its own of, left alone: not checked against
  /// the peers, not broadcast, not reduced (PyTorch's parameters to ignore).
  /// Expert parallelism's experts (moe/expert_parallel.h), whose gradients
  /// the caller reduces over their replicas.
  std::vector<at::Tensor> local_parameters;
};

/// Data parallelism for a user module, as PyTorch's DistributedDataParallel:
/// identical replicas, gradients averaged in buckets overlapped with backward.
/// The training loop is in this header's opening comment.
class DistributedDataParallel {
 public:
  /// Collective: every rank of `group` constructs it with the same model
  /// architecture. Checks that (ConfigError naming the ranks otherwise) and
  /// overwrites every rank's parameters and buffers with rank 0's. `group`
  /// must outlive this object; `module` is shared with the caller.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroup& group,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }  ///< the wrapped module
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }  ///< the same, shared
  comm::ProcessGroup& group() { return group_; }  ///< the ranks gradients are averaged over

  /// Prepares the next forward: opens the reducer's iteration (whose
  /// finish_backward() joins the peers when this rank's loss reaches no
  /// parameter) and brings buffers in line with rank 0's (broadcast_buffers;
  /// collective when the module has buffers). The constructor and step() do
  /// it, so a loop need not; call it before a forward whose buffers changed
  /// since (each micro-batch of an accumulation, as PyTorch's forward does),
  /// and to abandon a step whose backward threw, so training can go on after
  /// a caught error. Throws Error if the model's parameters were moved or
  /// converted after wrapping (model->to(...)): wrap after moving the model.
  void prepare_forward();

  /// Call after each loss.backward() (a trainer must; also inside no_sync(),
  /// where it does nothing). A no-op when backward synchronized. When this
  /// rank's loss reached no parameter, no hook fired and no collective was
  /// issued: without this call the peers would wait until the timeout. Here
  /// the rank joins every bucket's collective with its current .grad (zero
  /// after zero_grad()) and ends with the averaged .grad like its peers. Not
  /// an error even without find_unused_parameters. Collective in that case.
  void finish_backward() { reducer_->finish_backward(); }

  /// After each synchronized backward: finish_backward(), optimizer.step(),
  /// then prepares the next forward (prepare_forward(); collective), as
  /// ZeroDataParallel::step() and FullyShardedDataParallel::step() do for
  /// theirs. Throws Error (before stepping) inside no_sync(), where the
  /// gradients are this rank's own and stepping on them would let the
  /// replicas drift apart.
  void step(torch::optim::Optimizer& optimizer);

  /// Collective: overwrites every rank's buffers (BatchNorm running
  /// statistics) with rank 0's, now. prepare_forward() does it when
  /// broadcast_buffers is set; evaluation outside the training loop (or
  /// broadcast_buffers = false) calls this before using the buffers.
  void sync_buffers();

  /// While alive, backward does not communicate: gradients accumulate in .grad
  /// and the first backward after the guard is gone reduces the sum of all of
  /// them. For gradient accumulation over micro-batches:
  ///   { auto guard = ddp.no_sync(); for (k-1 micro-batches) { fwd; bwd; } }
  ///   fwd; bwd;  // synchronizes the accumulated gradients
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& reducer);  ///< turns synchronization off until destroyed
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }  ///< see NoSyncGuard

  /// The gradient reducer (buckets, hooks): for comm hooks such as PowerSgd::attach.
  Reducer& reducer() { return *reducer_; }
  /// Timings of the latest synchronized backward (see step_stats.h).
  StepStats last_step_stats() const { return reducer_->last_step(); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroup& group_;
  DdpOptions options_;
  std::vector<NamedTensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  /// step() just brought the buffers in line: the next prepare_forward()
  /// need not broadcast them again.
  bool buffers_fresh_ = false;
};

/// The module's trainable parameters (requires_grad), each tensor once, in
/// registration order, named as in named_parameters().
std::vector<NamedParameter> trainable_parameters(torch::nn::Module& module);
/// The module's buffers, each tensor once, in registration order.
std::vector<NamedTensor> module_buffers(torch::nn::Module& module);

}  // namespace paratrain::ddp

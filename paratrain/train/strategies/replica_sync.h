// The data-parallel side of the megatron strategy: the ranks that hold the
// same shards (its dp x cp "replicas": same tp and pp coordinates) average
// their gradients with DDP (zero.stage = 0), with ZeroDataParallel
// (zero.stage = 1 or 2: the optimizer steps only this rank's pieces, so its
// state is sharded over the replicas) or with FullyShardedDataParallel
// (zero.stage = 3, one module: the tp shards themselves live as pieces
// between uses; Note [FSDP over tensor-parallel shards]). One wrapper per
// module: the whole tensor-parallel GPT, or each local pipeline chunk. parallel.ep's experts
// stay whole beside both (their reduction is the ExpertParallel's): under
// ZeRO this also steps, scales, clears and checkpoints them beside the
// pieces. Not here: the model, the tp / pp reductions (megatron_strategy.cpp,
// megatron_stages.cpp).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/model_state.h"
#include "paratrain/core/tensor_slot.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/moe/expert_parallel.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/strategies/strategy.h"

namespace paratrain::train::strategies {

class ReplicaSync {
 public:
  // Collective over `replicas` (the wrappers broadcast rank 0's state).
  // DDP is skipped when `replicas` has one rank; ZeRO is built even then, so
  // the optimizer state and checkpoint layout are the ZeRO ones (as the zero
  // strategy on one rank).
  // `experts` (parallel.ep; not owned, may be null) are left out of the
  // wrappers (DdpOptions::local_parameters).
  ReplicaSync(const TrainConfig& config, const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
              comm::ProcessGroup& replicas, std::chrono::milliseconds timeout,
              moe::ExpertParallel* experts = nullptr);
  ~ReplicaSync();

  // ZeRO or FSDP: the optimizer steps pieces that differ across replicas.
  bool sharded() const { return !zero_.empty() || !fsdp_.empty(); }
  // FSDP (zero.stage = 3): the modules' trainable parameters are freed
  // views between uses; their values live in the pieces.
  bool fully_sharded() const { return !fsdp_.empty(); }
  // What the optimizer steps: every module's parameters, or the ZeRO pieces
  // and this rank's experts.
  std::vector<at::Tensor> optimizer_params() const;
  // The same, each with the name of the tensor it is (or is a piece of).
  std::vector<std::pair<at::Tensor, std::string>> named_optimizer_params() const;

  // Around module i's forward and backward. `sync` false: accumulate only.
  void prepare_forward(int i);
  void set_sync(int i, bool sync);
  void finish_backward(int i);
  // The same for a pipeline executor: reduce only in a chunk's last
  // backward of the step.
  pipeline::ExecutorHooks hooks(bool sync);

  // Before the optimizer step: ZeRO points the pieces' .grad at the reduced
  // gradients (idempotent). Then named_grads() lists what this rank steps,
  // each with its parameter's name: with ZeRO, disjoint pieces whose squares
  // sum over the replicas to the whole tensor's; without, whole gradients
  // equal on every replica.
  void finish_all();
  std::vector<std::pair<std::string, at::Tensor>> named_grads() const;
  void scale_gradients(double coef);
  // optimizer.step() (ZeRO: on the pieces, then all-gather each module's
  // parameters and clear the full gradients; otherwise the caller clears
  // them with optimizer.zero_grad()).
  void step(torch::optim::Optimizer& optimizer);
  // After the step, taken or skipped: without ZeRO optimizer.zero_grad();
  // with it the experts' whole gradients (ZeRO's own were cleared by the
  // step, or are overwritten by the next backward).
  void clear_gradients(torch::optim::Optimizer& optimizer);

  // An evaluation forward of module 0 (grad mode off): under FSDP through
  // its forward(), which frees the units after and rethrows a gather's
  // error; otherwise `forward()` as is.
  at::Tensor eval_forward(const std::function<at::Tensor()>& forward);
  // FSDP: free every gathered unit (local). Otherwise nothing.
  void reshard();
  // What the optimizer steps of the parameters named `names`: the whole
  // tensors, or (ZeRO-1, FSDP) this rank's pieces, whose .grad is the
  // reduced gradient's piece. The same list, in the same order, on every tp
  // rank of a replica (their modules have the same shapes).
  std::vector<at::Tensor> stepped_parts(const std::set<std::string>& names) const;
  // FSDP: every parameter of module 0 in full (this tp rank's shards),
  // collective over the replicas. Otherwise its parameters, detached.
  std::vector<std::pair<std::string, at::Tensor>> module_parameters();

  // Optimizer slots: without ZeRO each model slot with write as given; with
  // ZeRO each piece placed inside its parameter's model slot (`model`, by
  // name: a tp shard's segments), written by every replica (disjoint), where
  // `writes(name)` says this tp rank / stage writes the tensor at all.
  std::vector<checkpoint::OptimizerSlot> optimizer_slots(const std::vector<TensorSlot>& model,
                                             const std::function<bool(const std::string&)>& writes) const;
  // Model slots: `model` as given, except that under FSDP each trainable
  // parameter's slot is replaced by its pieces (placed by name as above);
  // frozen parameters and buffers stay whole.
  std::vector<TensorSlot> model_slots(const std::vector<TensorSlot>& model,
                                      const std::function<bool(const std::string&)>& writes) const;
  // After a checkpoint load: ZeRO all-gathers (the pieces alias the loaded
  // parameters; kept for the wrappers' own state).
  void after_load();

  SyncStats stats() const;
  ModelStateBytes memory(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                         const torch::optim::Optimizer& optimizer) const;

 private:
  std::vector<std::unique_ptr<ddp::DistributedDataParallel>> ddp_;
  std::vector<std::unique_ptr<zero::ZeroDataParallel>> zero_;
  std::vector<std::unique_ptr<fsdp::FullyShardedDataParallel>> fsdp_;
  // set_sync(i, false) under FSDP: accumulate until set_sync(i, true).
  std::vector<std::unique_ptr<fsdp::FullyShardedDataParallel::NoSyncGuard>> no_sync_;
  // The pieces (ZeRO, FSDP) with their slots inside the parameters.
  std::vector<std::pair<at::Tensor, TensorSlot>> piece_slots() const;
  std::vector<std::shared_ptr<torch::nn::Module>> modules_;
  moe::ExpertParallel* experts_ = nullptr;
};

// The runs of `model` (a tp shard's slot: its segments, or one run) that its
// local flat elements [offset, offset + numel) hold, relative to offset: a
// ZeRO piece of a tensor-parallel shard as TensorSlot::segments.
std::vector<SlotSegment> sub_segments(const TensorSlot& model, int64_t offset, int64_t numel);

}  // namespace paratrain::train::strategies

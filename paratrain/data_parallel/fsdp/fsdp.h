// FullyShardedDataParallel (ZeRO stage 3): parameters, gradients and
// optimizer state are all sharded over the data-parallel group. The model is
// cut into units (unit_plan.h); between uses each unit keeps only this
// rank's 1/world slice (flat_unit.h). A unit is all-gathered just before an
// operation first reads its parameters in forward, and again before its
// backward; it is freed after (forward: when the next unit starts, with
// reshard_after_forward; backward: once its gradients are reduce-scattered
// into the shards). Works on CPU with Gloo; the user's model object is not
// wrapped or changed (same parameters, same forward). Not here: the unit
// layout (flat_unit.h), gradient reduction (grad_sink.h), the mechanism that
// sees operations (touch_observer.h). Frozen parameters (requires_grad
// false) belong to no unit: each rank holds them whole, and they are never
// gathered, reduced or stepped.
//
//   FullyShardedDataParallel fsdp(model, group, options);
//   torch::optim::Adam opt(fsdp.optimizer_params(), ...);   // shard pieces only
//   for (...) {                 // forward on the thread that built fsdp (else prepare_forward() first)
//     auto loss = loss_fn(model->forward(shard_of_batch), target);
//     opt.zero_grad();
//     loss.backward();        // returns with averaged gradient slices in the pieces' .grad
//     fsdp.clip_grad_norm(1.0);  // optional, collective
//     fsdp.step(opt);
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/model_state.h"
#include "paratrain/core/tensor_slot.h"
#include "paratrain/data_parallel/fsdp/unit_plan.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace paratrain::fsdp {

/// How FullyShardedDataParallel cuts the model into units and when it gathers.
struct FsdpOptions {
  /// Units by size (zero.unit_min_params): consecutive children of the root
  /// module grouped until a unit holds at least this many elements. Smaller
  /// units: lower peak memory (one or two units gathered at a time), more and
  /// smaller collectives. <= 0: every child with parameters is a unit.
  int64_t unit_min_params = kDefaultUnitMinParams;
  /// Units by name (zero.unit_modules, split on commas): each named child of
  /// the root is its own unit, all other parameters form one root unit.
  /// Overrides unit_min_params when not empty.
  std::vector<std::string> unit_modules;
  /// True: a unit's parameters are freed once the next unit starts its
  /// forward and gathered again for backward (memory ~ one or two units; one
  /// more all-gather per unit per step). False: kept from forward until the
  /// unit's backward (memory ~ the whole model during forward/backward).
  bool reshard_after_forward = true;
  /// True: when a unit starts, the all-gather of the unit expected next
  /// (forward order learned in the first step; reverse in backward) starts
  /// too, overlapping communication with compute at the cost of one more
  /// unit gathered at a time. False: each gather starts when needed.
  bool prefetch = true;
  /// Gradients go through the DDP reducer (ddp/reducer.h), one bucket per
  /// unit; this is its find_unused_parameters. Off: a parameter that gets no
  /// gradient in a synchronized backward is an error naming it. On: it
  /// contributes zero (or what no_sync() accumulated), at the cost of one
  /// small all-reduce per step and of that unit's overlap (its bucket can only
  /// launch when backward ends). See Note [Unused parameters] in ddp.md.
  bool find_unused_parameters = false;
  /// How long a gather or reduce-scatter may take before TimeoutError.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  /// ZeRO-Offload (arXiv 2101.06840): optimizer_params() are pinned host
  /// copies of this rank's shard pieces, so the optimizer's state and step
  /// live in host memory. finish_backward() copies the reduced shard
  /// gradients down (a synchronized backward's; clip_grad_norm() and step()
  /// do it too when the loop did not call it), step() sends the stepped
  /// pieces back up into the shards, after_load() (after loading a
  /// checkpoint into the shards) refreshes the copies. On CPU tensors: the
  /// same, copied.
  bool offload = false;
  /// The model is a skeleton (models/skeleton.h, Note [Skeleton models]):
  /// its parameters are placeholders. The units are laid out and sharded
  /// without reading them and each unit's full buffer is freed as soon as it
  /// is made, so building costs one unit of memory; the ranks' parameters
  /// are neither compared nor broadcast. The shards hold zeros until the
  /// caller writes them (parameter_slots()); buffers stay the caller's.
  bool skeleton = false;
};

/// Bytes of model state alive on this rank (core/model_state.h): params =
/// shards + units currently gathered; grads = shard-piece .grad + full .grad
/// still alive (no_sync); optimizer_state = the optimizer's state tensors.
/// With offload the host copies of the pieces and of their gradients count
/// too (host and device bytes together).
using ::paratrain::ModelStateBytes;

/// One wrapping unit: parameters gathered and freed together.
struct UnitInfo {
  std::string name;                 ///< the unit's module path ("" for the root unit)
  std::vector<std::string> params;  ///< its parameters' names
  int64_t numel = 0;                ///< elements of those parameters
  int64_t padded_numel = 0;    ///< multiple of the group size
  int64_t shard_numel = 0;     ///< padded_numel / world
  int64_t gathered_bytes = 0;  ///< 0 while freed
};

/// Counters since construction, to see what the engine did.
struct FsdpStats {
  int64_t all_gathers = 0;      ///< unit gathers started (prefetched or on demand)
  int64_t prefetches = 0;       ///< of those, started ahead of the unit's first use
  int64_t frees = 0;            ///< unit buffers released
  int64_t reduce_scatters = 0;  ///< unit gradients reduced
};

/// ZeRO-3 / FSDP for a user module: every parameter, gradient and optimizer
/// state is sharded over the group; a unit's parameters are all-gathered just
/// before its forward and backward and freed after. See this header's opening
/// comment for the training loop.
class FullyShardedDataParallel {
 public:
  /// Collective: every rank of `dp` constructs it with the same architecture
  /// (checked: ConfigError otherwise). Parameters and buffers are taken from
  /// rank 0; each parameter's data becomes a view of its unit's flat buffer,
  /// which is freed before this returns. Frozen parameters (requires_grad
  /// false) stay whole and belong to no unit.
  /// `dp` must outlive this object; `model` is shared with the caller, who
  /// keeps calling model->forward on the thread that built this engine or
  /// called prepare_forward(). Any operation on that thread that reads a
  /// freed parameter (forward, backward, but also printing or torch::save)
  /// gathers its unit first: a collective, so every rank must do the same;
  /// full_parameters() is the explicit way to read values.
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& dp,
                           FsdpOptions options = {});
  /// The model's parameters stay views of freed memory afterwards (gathering
  /// would be a collective): take full_parameters() first to keep the values.
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  /// The caller's model, unchanged in type: forward works as before.
  const std::shared_ptr<torch::nn::Module>& module() const;
  comm::ProcessGroup& group();  ///< the ranks the model is sharded over

  /// Leaf tensors for the optimizer: this rank's piece of each parameter
  /// (1-D, a view of its unit's shard), in unit order. Parameters entirely
  /// owned by other ranks have no piece here. parameter_slots()[i] describes
  /// optimizer_params()[i] (name, global shape, offset): the mapping from
  /// optimizer state to parameter names for checkpoints.
  std::vector<at::Tensor> optimizer_params() const;
  std::vector<TensorSlot> parameter_slots() const;  ///< see optimizer_params()

  /// Call before each forward (also under no_sync and for evaluation), on the
  /// thread that runs forward and backward. Rethrows an error kept from a
  /// gather that failed inside an operation, and abandons a step whose
  /// backward threw.
  void prepare_forward();
  /// prepare_forward(), then `forward()` (e.g. [&] { return model->forward(x); });
  /// when grad mode is off (evaluation), frees every unit afterwards.
  at::Tensor forward(const std::function<at::Tensor()>& forward);
  /// After loss.backward(): rethrows a kept error; otherwise a no-op, since
  /// backward's end already reduced and freed everything.
  void finish_backward();
  /// Global L2 norm of the gradient (all shards, one all-reduce), and scales
  /// the shard gradients as torch::nn::utils::clip_grad_norm_ does on the
  /// whole model. Collective. Returns the norm before clipping, a 0-dim
  /// double tensor on the shards' device (reading it is a GPU sync: Note
  /// [Clipping without a sync] in optim/clip.h).
  at::Tensor clip_grad_norm(double max_norm);
  /// optimizer.step() over the shard pieces. Units gathered for evaluation
  /// are freed (stale now); the next forward gathers the new values.
  void step(torch::optim::Optimizer& optimizer);
  /// Frees every gathered unit (local, no communication).
  void reshard();

  /// After a checkpoint was loaded into the shards (the slots of
  /// parameter_slots()): with offload the optimizer's host copies take the
  /// loaded values, then reshard(). Without offload the same as reshard().
  void after_load();

  /// While alive, backward does not communicate: full gradients accumulate
  /// in the parameters' .grad (memory: one full gradient) and the first
  /// backward after the guard is gone reduce-scatters their sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallel& fsdp);  ///< turns synchronization off until destroyed
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedDataParallel& fsdp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }  ///< see NoSyncGuard

  /// Collective: every parameter in full, named as in named_parameters() and
  /// in that order (detached copies; the units stay as they are).
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();
  /// Model-state bytes this rank holds now (see ModelStateBytes above);
  /// `optimizer`'s state counted when given.
  ModelStateBytes model_state_bytes(const torch::optim::Optimizer* optimizer = nullptr) const;
  std::vector<UnitInfo> units() const;  ///< the units, in forward order
  FsdpStats stats() const;              ///< counters since construction

  class Impl;

 private:
  struct Offloaded;  // the host copies of the pieces (FsdpOptions::offload)
  void copy_grads_down();
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<Offloaded> offload_;
};

}  // namespace paratrain::fsdp

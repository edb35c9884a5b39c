// ZeroDataParallel: ZeRO stages 1 and 2 (Rajbhandari et al., arXiv 1910.02054)
// for a LibTorch module. Every rank keeps the full parameters (forward and
// backward are plain data parallelism) but owns only one shard of each
// gradient bucket: the optimizer sees only that shard, so optimizer state is
// divided by the group size (stage 1), and with stage 2 the gradients too.
// Not here: the bucketing and overlap (ddp/reducer.h), which slice is whose
// (shard_layout.h), stage 3 / FSDP (data_parallel/fsdp/).
//
//   ZeroDataParallel zero(model, dp, {.stage = 2});
//   torch::optim::Adam opt(zero.optimizer_params(), torch::optim::AdamOptions(1e-3));
//   for (...) {
//     auto loss = loss_fn(model->forward(shard_of_batch), target);
//     loss.backward();            // stage 2: gradients reduce-scattered during backward
//     zero.clip_grad_norm(1.0);   // optional: global norm over all shards
//     zero.step(opt);             // opt.step() on the shard, all-gather parameters, prepare the next forward
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/tensor_slot.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/int8_compression.h"
#include "paratrain/core/model_state.h"
#include "paratrain/data_parallel/zero/shard_layout.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace paratrain::zero {

/// Which ZeRO stage and how its buckets are cut.
struct ZeroOptions {
  /// 1: optimizer state sharded; gradients all-reduced in full (same traffic
  ///    as DDP); each rank's shard gradients are its slice of the full .grad
  ///    (no copy). Full-size .grad and the reducer's bucket buffers stay
  ///    allocated (.grad zeroed after each step).
  /// 2: gradients sharded too: each bucket is reduce-scattered during
  ///    backward (half the all-reduce's traffic); full-size .grad and the
  ///    reducer's bucket buffers are freed after the step's reduction. Needs
  ///    more care with code that reads .grad.
  int stage = 1;
  /// Bucket sizes as for DDP. pad_to_multiple is set to the group size (each
  /// bucket must split into equal shards); a value given here is ignored.
  ddp::BucketPlanOptions buckets;
  /// As ReducerOptions::find_unused_parameters.
  bool find_unused_parameters = false;
  /// As DdpOptions::broadcast_buffers.
  bool broadcast_buffers = true;
  /// Longest wait for one collective before TimeoutError.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  /// Gradients on the wire: kFloat as they are; kBFloat16 / kHalf half the
  /// bytes, summed in fp32 (stage 1: the 16-bit all-reduce of DDP's
  /// low_precision_hook; stage 2: a 16-bit reduce-scatter). Each rank's
  /// averaged gradient is rounded to 16 bits once on the way.
  at::ScalarType comm_wire = at::kFloat;
  /// The int8 wire with error feedback (ddp.compression = "int8";
  /// ddp/int8_compression.h) instead: stage 1 all-reduces through its hook,
  /// stage 2 reduce-scatters through it; the constructor attaches it.
  /// comm_wire must stay kFloat.
  std::shared_ptr<ddp::Int8Compression> int8_wire;
  /// ZeRO-Offload (arXiv 2101.06840): the optimizer's parameters are host
  /// copies of this rank's pieces, so its state lives and its step runs in
  /// host memory. After the reduction the shard gradients are copied to the
  /// host (pinned), where unscaling, clipping and the step happen; the
  /// all-gather sends the stepped host pieces back up. GPU memory then holds
  /// the full parameters and gradients but no optimizer state. On CPU
  /// tensors it changes nothing but adds copies (tests).
  bool offload = false;
  /// Parameters each rank holds its own of, left out of the replicas'
  /// checks, the broadcast and the shards (as DdpOptions::local_parameters):
  /// expert parallelism's experts, which the caller reduces and steps.
  std::vector<at::Tensor> local_parameters;
};

/// ZeRO stages 1 and 2 (arXiv 1910.02054) for a user module: full replicas of
/// the parameters, optimizer state (and at stage 2 gradients) sharded over the
/// group. Build the optimizer over optimizer_params() and call step() through
/// this object. See this header's opening comment for the training loop.
class ZeroDataParallel {
 public:
  using NoSyncGuard = ddp::DistributedDataParallel::NoSyncGuard;  ///< as DDP's

  /// Collective: every rank of `group` constructs it with the same model
  /// architecture (ConfigError otherwise); rank 0's parameters and buffers are
  /// broadcast. Trainable parameters must be dense and contiguous. `group` must
  /// outlive this object; `module` is shared with the caller.
  ZeroDataParallel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroup& group, ZeroOptions options = {});
  ~ZeroDataParallel();
  ZeroDataParallel(const ZeroDataParallel&) = delete;
  ZeroDataParallel& operator=(const ZeroDataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }  ///< the wrapped module
  comm::ProcessGroup& group() { return group_; }    ///< the ranks state is sharded over
  int stage() const { return options_.stage; }      ///< 1 or 2
  /// Buckets as layout groups, indices into trainable_parameters() order.
  const ShardLayout& layout() const { return layout_; }
  /// This rank's pieces, parallel to optimizer_params().
  const std::vector<ShardPiece>& pieces() const { return pieces_; }

  /// This rank's shard: one flat leaf tensor requiring grad per piece of a
  /// parameter it owns (so per-parameter optimizer semantics stay per piece).
  /// Build any LibTorch optimizer over them. Each aliases its piece of the
  /// module's full parameter (no second copy): stepping them updates this
  /// rank's pieces in place, and step()/gather_parameters() sends them to the
  /// other ranks. With `offload` they are host copies of the pieces instead.
  const std::vector<at::Tensor>& optimizer_params() const { return piece_params_; }

  /// Prepares the next forward: opens the reducer's iteration (whose
  /// finish_backward() joins the peers when this rank's loss reaches no
  /// parameter), abandons a failed step, zeroes stage 1's full .grad if a
  /// finished backward was not stepped yet, and broadcasts buffers (when
  /// enabled; collective then). The constructor and step()/end_step() do it,
  /// so a loop need not; call it before a forward whose buffers changed since
  /// (each micro-batch of an accumulation) or after a caught error.
  void prepare_forward();

  /// After a synchronized backward: stage 1 points each shard gradient at this
  /// rank's slice of the averaged full .grad (re-made when .grad was replaced),
  /// stage 2 has nothing left to do (the sink filled the shard during backward).
  /// Points each optimizer param's .grad at its shard gradient. Returns false
  /// (and does nothing) when no synchronized backward ran since the last call.
  /// clip_grad_norm() and step() call it, so calling it yourself is optional.
  bool finish_backward();

  /// Collective. Global gradient-norm clipping over the shards of all ranks:
  /// the norm of the full averaged gradient (padding is zero), then every shard
  /// scaled by min(1, max_norm / (norm + 1e-6)) as torch::nn::utils::
  /// clip_grad_norm_ does on unsharded gradients. norm_type: 2 or infinity.
  /// Returns the total norm before clipping, a 0-dim double tensor on the
  /// shards' device: reading it (.item()) is the caller's choice, and on a
  /// GPU a sync (Note [Clipping without a sync] in optim/clip.h).
  at::Tensor clip_grad_norm(double max_norm, double norm_type = 2.0);

  /// Collective. optimizer.step() on the shard, zeroes stage 1's full .grad
  /// (the optimizer's zero_grad() reaches only this rank's slices), then
  /// gather_parameters() and prepare_forward() for the next forward.
  /// `optimizer` must be built over optimizer_params(). Throws Error when no
  /// synchronized backward ran since the last step (e.g. still in no_sync()).
  void step(torch::optim::Optimizer& optimizer);

  /// step() in two halves, for one optimizer over the shards of several
  /// ZeroDataParallel instances (a pipeline rank's model chunks): begin_step()
  /// on each, optimizer.step() once, end_step() on each (collective: the
  /// all-gather). begin_step() throws as step() does without a synchronized
  /// backward.
  void begin_step();
  void end_step();  ///< the second half of step(): see begin_step()

  /// This rank's sum of squared shard gradients (the padding is zero): summed
  /// over the group (and over the pipeline's stages) it is the squared global
  /// norm, for clipping across several instances; scale_gradients(c) then
  /// multiplies every shard gradient by c. clip_grad_norm() is both in one.
  double local_grad_square_sum();
  void scale_gradients(double coef);  ///< see local_grad_square_sum()

  /// Collective. All-gathers every rank's parameter shard into the full
  /// parameters of the module, bucket by bucket (after step() or after
  /// loading a checkpoint into the pieces).
  void gather_parameters();

  /// Collective. After a checkpoint was loaded into the pieces (the slots of
  /// parameter_slots(), which alias the full parameters): with offload the
  /// optimizer's host copies take the loaded values, then
  /// gather_parameters(). Without offload the same as gather_parameters().
  void after_load();

  /// While alive, backward accumulates into .grad without communicating; the
  /// first backward after it reduces the sum (gradient accumulation):
  ///   { auto guard = zero.no_sync(); for (k-1 micro-batches) { fwd; bwd; } }
  ///   fwd; bwd; zero.step(opt);
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  /// Checkpoint view: one slot per piece (parameter name, global shape, flat
  /// offset, local = an alias of the piece; write = true: pieces are disjoint).
  std::vector<TensorSlot> parameter_slots() const;
  /// Each optimizer param with its slot, so optimizer state tensors (shaped
  /// like their param) can be saved under the same coordinates.
  std::vector<std::pair<at::Tensor, TensorSlot>> optimizer_param_slots() const;

  /// Model-state bytes this rank holds now: full parameters (the pieces alias
  /// them), gradients (full .grad where defined plus the shard gradients, each
  /// storage once: stage 1's shard gradients alias the full .grad), the
  /// state of `optimizer` (nullptr: not counted), and the reducer's bucket
  /// buffers allocated now (stage 1: all of them; stage 2: none between steps).
  /// fp32 Adam between steps, up to padding: stage 1 8 Psi + 8 Psi / N (plus
  /// comm_buffers), stage 2 4 Psi + (4 + 8) Psi / N. With offload, the host
  /// copies (4 Psi / N of parameters and of gradients) count as well: host
  /// and device bytes together; the optimizer's state is then all host memory.
  ModelStateBytes model_state_bytes(const torch::optim::Optimizer* optimizer = nullptr) const;

  ddp::Reducer& reducer() { return *reducer_; }  ///< the gradient reducer (buckets, hooks)

 private:
  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroup& group_;
  ZeroOptions options_;
  std::vector<ddp::NamedParameter> params_;
  std::vector<at::Tensor> buffers_;  ///< broadcast from rank 0 before each forward
  std::unique_ptr<ddp::Reducer> reducer_;
  ShardLayout layout_;
  std::vector<ShardPiece> pieces_;
  void clear_full_grads();

  std::vector<at::TensorOptions> shard_options_;  ///< per bucket: dtype and device of its shard
  std::vector<at::Tensor> grad_shards_;   ///< stage 2, per bucket: this rank's slice of the averaged gradients
  std::vector<at::Tensor> piece_params_;  ///< per piece: aliases into the full parameters
  std::vector<at::Tensor> piece_grads_;   ///< per piece: aliases into grad_shards_ (2) or the full .grad (1)
  std::vector<at::Tensor> device_pieces_; ///< offload, per piece: its alias in the full parameter
  std::vector<at::Tensor> host_grads_;    ///< offload, per piece: the shard gradient copied to the host
  /// The shard gradients clipping and scaling work on: the host copies with
  /// offload, else piece_grads_.
  const std::vector<at::Tensor>& shard_grads() const { return options_.offload ? host_grads_ : piece_grads_; }
  void copy_grads_to_host();
  int64_t finished_steps_ = 0;            ///< reducer steps consumed by finish_backward()
  int64_t stepped_steps_ = 0;             ///< finished_steps_ at the last step()
  bool full_grads_pending_ = false;       ///< stage 1: averaged full .grad not yet zeroed
  bool forward_prepared_ = false;         ///< prepare_forward() ran: finish_backward() may join
  bool buffers_fresh_ = false;            ///< end_step() broadcast the buffers: the next prepare_forward() need not
};

}  // namespace paratrain::zero

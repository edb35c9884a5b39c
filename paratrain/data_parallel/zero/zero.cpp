// ZeroDataParallel: see zero.h. Optimizer params alias their slice of the full
// parameters; their .grad aliases this rank's slice of the averaged gradients:
// of the full .grad (stage 1) or of a flat per-bucket shard buffer (stage 2).
#include "paratrain/data_parallel/zero/zero.h"

#include <unordered_set>

#include <optional>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/tensor_alias.h"
#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/data_parallel/ddp/module_sync.h"
#include "paratrain/data_parallel/zero/reduce_scatter_sink.h"
#include "paratrain/optim/clip.h"

namespace paratrain::zero {
namespace {

constexpr int kSourceRank = 0;

// Whether `alias` still is the `numel` elements of `full` starting `offset`
// elements in (false once .grad was replaced, e.g. set to None and re-made).
bool aliases(const at::Tensor& alias, const at::Tensor& full, int64_t offset, int64_t numel) {
  return alias.defined() && full.defined() && alias.numel() == numel &&
         alias.storage().is_alias_of(full.storage()) && alias.storage_offset() == full.storage_offset() + offset;
}

// The layout's groups are the reducer's buckets: the same parameters at the
// same offsets, so a bucket's buffer is exactly what reduce_scatter splits.
std::vector<LayoutGroup> groups_of(const std::vector<ddp::BucketPlan>& plans,
                                   const std::vector<ddp::NamedParameter>& params) {
  std::vector<LayoutGroup> groups;
  for (const ddp::BucketPlan& plan : plans) {
    LayoutGroup g;
    g.numel = plan.padded_numel;
    for (std::size_t i = 0; i < plan.params.size(); ++i) {
      g.params.push_back({plan.params[i], params[plan.params[i]].tensor.numel(), plan.offsets[i]});
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

void validate(const std::vector<ddp::NamedParameter>& params, const ZeroOptions& options, int rank) {
  if (options.stage != 1 && options.stage != 2) {
    throw ConfigError(fmt::format("rank {}: ZeroDataParallel: stage = {}; this engine runs stages 1 and 2 "
                                  "(stage 0 is DistributedDataParallel, stage 3 is FSDP)",
                                  rank, options.stage));
  }
  for (const auto& p : params) {
    TORCH_CHECK(p.tensor.is_contiguous(), "ZeroDataParallel: parameter '", p.name,
                "' is not contiguous; shards are slices of the flattened parameter");
  }
}

}  // namespace

ZeroDataParallel::ZeroDataParallel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroup& group,
                                   ZeroOptions options)
    : module_(std::move(module)), group_(group), options_(std::move(options)) {
  TORCH_CHECK(module_ != nullptr, "ZeroDataParallel: module is null");
  const int rank = group_.rank();
  const int world = group_.size();
  std::unordered_set<const void*> local;
  for (const auto& t : options_.local_parameters) local.insert(t.unsafeGetTensorImpl());
  for (auto& p : ddp::trainable_parameters(*module_)) {
    if (!local.count(p.tensor.unsafeGetTensorImpl())) params_.push_back(std::move(p));
  }
  validate(params_, options_, rank);
  const std::vector<ddp::NamedTensor> buffers = ddp::module_buffers(*module_);
  for (const auto& b : buffers) buffers_.push_back(b.tensor);

  // Replicas start identical, exactly as DistributedDataParallel does it:
  // every parameter, frozen ones included.
  std::vector<ddp::NamedTensor> all_params;
  std::vector<at::Tensor> all_param_tensors;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (local.count(item.value().unsafeGetTensorImpl())) continue;
    all_params.push_back({item.key() + (item.value().requires_grad() ? "" : " (frozen)"), item.value()});
    all_param_tensors.push_back(item.value());
  }
  ddp::verify_same_tensors(group_, all_params, "parameters", options_.timeout);
  ddp::verify_same_tensors(group_, buffers, "buffers", options_.timeout);
  ddp::broadcast_coalesced(group_, all_param_tensors, kSourceRank, options_.timeout);
  ddp::broadcast_coalesced(group_, buffers_, kSourceRank, options_.timeout);

  // The buckets are planned here and handed to the reducer, so the layout
  // and the shards exist before the reducer's sink needs them.
  ddp::BucketPlanOptions bucket_options = options_.buckets;
  bucket_options.pad_to_multiple = world;
  std::vector<ddp::ParamSpec> specs;
  for (const auto& p : params_) specs.push_back({p.tensor.numel(), p.tensor.scalar_type(), p.tensor.device()});
  std::vector<ddp::BucketPlan> plans = ddp::plan_buckets(specs, bucket_options);

  layout_ = ShardLayout(groups_of(plans, params_), world);
  pieces_ = layout_.pieces(rank);
  for (std::size_t g = 0; g < plans.size(); ++g) {
    shard_options_.push_back(at::TensorOptions().dtype(plans[g].dtype).device(plans[g].device));
    // Stage 1 needs no shard buffer: its shard gradients are slices of the
    // full averaged .grad (see finish_backward()).
    if (options_.stage == 2) grad_shards_.push_back(at::zeros({layout_.shard_numel(g)}, shard_options_[g]));
  }
  // An optimizer param is this rank's piece of the full parameter itself (a
  // piece is contiguous within one parameter), not a copy: fp32 ZeRO needs no
  // second parameter copy, so parameter memory stays 4 bytes per element.
  // The step updates the piece in place; gather_parameters() sends it.
  for (const ShardPiece& piece : pieces_) {
    at::Tensor param = alias_of(params_[piece.param].tensor, piece.param_offset, {piece.numel});
    if (options_.offload) {
      // The optimizer's copy in host memory; pinned, so the copies between
      // it and the GPU need no staging buffer of their own.
      device_pieces_.push_back(param);
      const auto host = param.options().device(at::kCPU).pinned_memory(!param.is_cpu()).requires_grad(false);
      at::Tensor copy = at::empty({piece.numel}, host);
      copy.copy_(param.detach());
      copy.set_requires_grad(true);
      piece_params_.push_back(copy);
      host_grads_.push_back(at::zeros({piece.numel}, host));
    } else {
      param.set_requires_grad(true);
      piece_params_.push_back(param);
    }
    // Stage 1: filled in by finish_backward(), once the full .grad exists.
    piece_grads_.push_back(options_.stage == 2 ? alias_of(grad_shards_[piece.group], piece.shard_offset, {piece.numel})
                                               : at::Tensor());
  }

  // Stage 1: the reducer's default all-reduce and write-back (DDP's traffic);
  // finish_backward() points the shard at our slice of the result. Stage 2: the sink reduce-scatters each
  // bucket into grad_shards_ as soon as backward filled it, and the reducer
  // leaves the full .grad undefined.
  ddp::ReducerOptions reducer_options;
  reducer_options.plans = std::move(plans);
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.timeout = options_.timeout;
  // finish_backward() and step() count the reducer's synchronized steps,
  // which its no-hook shortcut on one rank would leave at 0.
  reducer_options.single_rank_passthrough = false;
  if (options_.int8_wire && options_.comm_wire != at::kFloat)
    throw ConfigError("ZeRO: the int8 gradient wire and a 16-bit comm_wire are exclusive; choose one");
  if (options_.stage == 2) {
    reducer_options.sink = std::make_shared<ReduceScatterSink>(grad_shards_, options_.comm_wire, options_.int8_wire);
  } else if (options_.int8_wire) {
    reducer_options.comm_hook = options_.int8_wire->hook();
  } else if (options_.comm_wire != at::kFloat) {
    reducer_options.comm_hook = ddp::low_precision_hook(options_.comm_wire);
  }
  reducer_ = std::make_unique<ddp::Reducer>(params_, group_, std::move(reducer_options));
  if (options_.int8_wire) options_.int8_wire->attach(*reducer_, options_.stage == 2);
  // The first forward is prepared (Note [One wrapper protocol]).
  reducer_->prepare_forward();
  forward_prepared_ = true;
}

ZeroDataParallel::~ZeroDataParallel() = default;

void ZeroDataParallel::prepare_forward() {
  // Also opens the iteration whose finish_backward() joins the peers when
  // this rank's loss reaches no parameter (Note [Joining] in docs/notes/ddp.md).
  reducer_->prepare_forward();
  forward_prepared_ = true;
  clear_full_grads();
  if (options_.broadcast_buffers && !buffers_.empty() && !std::exchange(buffers_fresh_, false)) {
    ddp::broadcast_coalesced(group_, buffers_, kSourceRank, options_.timeout);
  }
}

bool ZeroDataParallel::finish_backward() {
  // No hook fired on this rank since prepare_forward() (its loss reached no
  // parameter): join the peers' collectives, which wait for it, with zero
  // gradients. A no-op after a synchronized backward and under no_sync().
  if (forward_prepared_) reducer_->finish_backward();
  const int64_t synced = reducer_->synced_steps();
  if (synced == finished_steps_) return false;
  finished_steps_ = synced;
  torch::NoGradGuard no_grad;
  if (options_.stage == 1) {
    // The reducer left the average over ranks in every .grad (copied into the
    // existing .grad, so its storage usually survives from step to step). Our
    // shard gradient is the slice of it, not a copy: 4 Psi of gradients, not
    // 4 Psi + 4 Psi / N. Re-pointed every step, because .grad may have been
    // replaced since (zero_grad(set_to_none), the reducer's first write-back).
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      const ShardPiece& piece = pieces_[k];
      at::Tensor& full = params_[piece.param].tensor.mutable_grad();
      // No rank used it (find_unused_parameters): a zero gradient, as DDP.
      if (!full.defined()) full = at::zeros_like(params_[piece.param].tensor);
      if (!aliases(piece_grads_[k], full, piece.param_offset, piece.numel)) {
        piece_grads_[k] = alias_of(full, piece.param_offset, {piece.numel});
      }
    }
    full_grads_pending_ = true;  // cleared after the step, before the next backward
  }
  // Stage 2: the sink already reduce-scattered every bucket into
  // grad_shards_, and the reducer left the full .grad undefined.
  if (options_.offload) copy_grads_to_host();
  // Re-point in case the optimizer replaced .grad (zero_grad(set_to_none)).
  const std::vector<at::Tensor>& grads = shard_grads();
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    at::Tensor& grad = piece_params_[k].mutable_grad();
    if (!grad.defined() || !grad.is_same(grads[k])) grad = grads[k];
  }
  return true;
}

// Offload: every shard gradient down to its pinned host copy, queued on the
// GPU's stream without waiting between them, then one wait for them all
// (the step that follows reads them on the host).
void ZeroDataParallel::copy_grads_to_host() {
  std::optional<c10::Device> device;
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    host_grads_[k].copy_(piece_grads_[k], /*non_blocking=*/true);
    if (!piece_grads_[k].is_cpu()) device = piece_grads_[k].device();
  }
  if (device) c10::impl::VirtualGuardImpl(device->type()).getStream(*device).synchronize();
}

// Stage 1: the optimizer's zero_grad() zeroes only this rank's slices of the
// full .grad (or sets them to None); the other ranks' slices must be zero too
// before the next backward accumulates into it. In place, so the storage and
// the shard aliases stay.
void ZeroDataParallel::clear_full_grads() {
  if (options_.stage == 1) {
    // A .grad set to None since (zero_grad(set_to_none)) is re-made by the
    // next backward: drop the aliases of the old one so its storage is freed
    // now, not held alongside the new one.
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      const at::Tensor& full = params_[pieces_[k].param].tensor.grad();
      if (aliases(piece_grads_[k], full, pieces_[k].param_offset, pieces_[k].numel)) continue;
      if (piece_params_[k].grad().defined() && piece_params_[k].grad().is_same(piece_grads_[k])) {
        piece_params_[k].mutable_grad().reset();
      }
      piece_grads_[k].reset();
    }
  }
  if (!full_grads_pending_) return;
  full_grads_pending_ = false;
  torch::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().zero_();
  }
}

// Padding and elements other ranks own contribute nothing locally, so summing
// squares (or taking the max) per rank and reducing over the group gives the
// norm of the full gradient, in a different summation order than the
// unsharded torch::nn::utils::clip_grad_norm_.
at::Tensor ZeroDataParallel::clip_grad_norm(double max_norm, double norm_type) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm: max_norm = ", max_norm, " must be > 0");
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  TORCH_CHECK(inf || norm_type == 2.0, "clip_grad_norm: norm_type = ", norm_type, "; only 2 and infinity are supported");
  finish_backward();
  torch::NoGradGuard no_grad;
  // Summed (or maxed) in double on the gradients' device, in shard order:
  // no value is read on the host (Note [Clipping without a sync]).
  const std::vector<at::Tensor>& grads = shard_grads();
  at::Tensor local;
  for (const at::Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    if (!local.defined()) local = at::zeros({1}, g.options().dtype(at::kDouble));
    const at::Tensor g64 = g.to(at::kDouble);
    local = inf ? at::maximum(local, g64.abs().max()) : local + g64.square().sum();
  }
  if (!local.defined()) local = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
  at::Tensor total = shard_options_.empty() ? local : local.to(shard_options_.front().device());
  group_.all_reduce(total, inf ? comm::ReduceOp::kMax : comm::ReduceOp::kSum)->wait(options_.timeout);
  const at::Tensor norm = (inf ? total : total.sqrt()).reshape({});
  optim::scale_by_coefficient(grads, optim::clip_coefficient(norm, max_norm));
  return norm;
}

void ZeroDataParallel::begin_step() {
  finish_backward();
  if (finished_steps_ == stepped_steps_) {
    throw Error(fmt::format("rank {}: ZeroDataParallel::step() without a synchronized backward since the "
                            "last step: the shard gradients are stale. Run a backward outside no_sync() "
                            "before stepping",
                            group_.rank()));
  }
  stepped_steps_ = finished_steps_;
}

void ZeroDataParallel::end_step() {
  clear_full_grads();
  gather_parameters();  // with offload: the stepped host pieces, straight into the send buffers
  // The next forward needs nothing from the loop (Note [One wrapper protocol]).
  prepare_forward();
  buffers_fresh_ = true;
}

void ZeroDataParallel::step(torch::optim::Optimizer& optimizer) {
  begin_step();
  optimizer.step();
  end_step();
}

double ZeroDataParallel::local_grad_square_sum() {
  finish_backward();
  torch::NoGradGuard no_grad;
  double local = 0;
  for (const at::Tensor& g : shard_grads()) {
    if (g.defined() && g.numel() > 0) local += g.to(at::kDouble).square().sum().item<double>();
  }
  return local;
}

void ZeroDataParallel::scale_gradients(double coef) {
  torch::NoGradGuard no_grad;
  for (at::Tensor g : shard_grads()) {
    if (g.defined()) g.mul_(coef);
  }
}

// The pieces live inside the full parameters, so each bucket's shard is
// packed into a send buffer first (padding zero). All gathers are issued
// first and consumed in order, so bucket b's copy into the parameters
// overlaps with later buckets' transfers. Costs one shard-size send buffer
// and one full-size gather buffer per bucket until it is consumed.
void ZeroDataParallel::after_load() {
  // Offload: what was loaded into the full parameters (a checkpoint writes
  // the slots, which alias them) becomes the optimizer's host copy too.
  if (options_.offload) {
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < pieces_.size(); ++k) piece_params_[k].detach().copy_(device_pieces_[k]);
  }
  gather_parameters();
}

void ZeroDataParallel::gather_parameters() {
  torch::NoGradGuard no_grad;
  const int world = group_.size();
  const std::size_t groups = shard_options_.size();
  std::vector<at::Tensor> send(groups);
  for (std::size_t g = 0; g < groups; ++g) send[g] = at::zeros({layout_.shard_numel(g)}, shard_options_[g]);
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    send[pieces_[k].group].narrow(0, pieces_[k].shard_offset, pieces_[k].numel).copy_(piece_params_[k]);
  }
  std::vector<at::Tensor> gathered(groups);
  std::vector<comm::WorkHandle> works(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    gathered[g] = at::empty({send[g].numel() * world}, send[g].options());
    works[g] = group_.all_gather(gathered[g], send[g]);
  }
  for (std::size_t g = 0; g < groups; ++g) {
    works[g]->wait(options_.timeout);
    for (const LayoutParam& p : layout_.group(g).params) {
      params_[p.param].tensor.detach().view({-1}).copy_(gathered[g].narrow(0, p.offset, p.numel));
    }
    gathered[g] = at::Tensor();
    send[g] = at::Tensor();
  }
}

std::vector<TensorSlot> ZeroDataParallel::parameter_slots() const {
  std::vector<TensorSlot> out;
  for (const auto& [param, slot] : optimizer_param_slots()) out.push_back(slot);
  return out;
}

std::vector<std::pair<at::Tensor, TensorSlot>> ZeroDataParallel::optimizer_param_slots() const {
  std::vector<std::pair<at::Tensor, TensorSlot>> out;
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const ShardPiece& piece = pieces_[k];
    const at::Tensor& full = params_[piece.param].tensor;
    TensorSlot slot;
    slot.name = params_[piece.param].name;
    slot.global_shape.assign(full.sizes().begin(), full.sizes().end());
    slot.flat_offset = piece.param_offset;
    slot.local = alias_of(full, piece.param_offset, {piece.numel});
    slot.write = true;
    out.emplace_back(piece_params_[k], std::move(slot));
  }
  return out;
}

ModelStateBytes ZeroDataParallel::model_state_bytes(const torch::optim::Optimizer* optimizer) const {
  std::vector<at::Tensor> params = piece_params_;  // alias the full parameters: counted once
  // Stage 1: the shard gradients alias the full .grad (counted once);
  // stage 2: the shard buffers, the full .grad undefined between steps.
  std::vector<at::Tensor> grads = grad_shards_;
  grads.insert(grads.end(), piece_grads_.begin(), piece_grads_.end());
  // Offload: the host copies count too (params above: piece_params_ are them).
  grads.insert(grads.end(), host_grads_.begin(), host_grads_.end());
  for (const auto& p : params_) {
    params.push_back(p.tensor);
    grads.push_back(p.tensor.grad());
  }
  ModelStateBytes out;
  out.params = tensor_bytes(params);
  out.grads = tensor_bytes(grads);
  if (optimizer != nullptr) out.optimizer_state = tensor_bytes(optimizer_state_tensors(*optimizer));
  // Stage 1: the buckets, always (DDP's write-back). Stage 2: 0 between
  // steps (transient buckets, see Note [Transient bucket buffers]).
  out.comm_buffers = reducer_->buffer_bytes();
  return out;
}

}  // namespace paratrain::zero

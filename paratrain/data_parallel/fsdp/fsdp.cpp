// FullyShardedDataParallel: construction (same model on every rank, rank 0's
// values, units built and freed), and the collectives and views around the
// step: clipping, full parameters, checkpoint slots, memory accounting. The
// per-step state machine is engine.cpp.
#include "paratrain/data_parallel/fsdp/fsdp.h"

#include <optional>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <torch/torch.h>

#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/module_sync.h"
#include "paratrain/data_parallel/fsdp/engine.h"
#include "paratrain/data_parallel/fsdp/unit_plan.h"
#include "paratrain/optim/clip.h"

namespace paratrain::fsdp {
namespace {

std::vector<FlatUnit> build_units(torch::nn::Module& model, comm::ProcessGroup& group, const FsdpOptions& options) {
  std::vector<FlatUnit> units;
  for (PlannedUnit& planned : plan_units(model, {options.unit_min_params, options.unit_modules})) {
    std::vector<UnitParam> params;
    for (auto& [name, tensor] : planned.params) params.push_back({name, tensor});
    units.emplace_back(std::move(planned.name), std::move(params), group.rank(), group.size());
    // A skeleton's units are freed as they come: one unit's memory at a time.
    if (options.skeleton) units.back().free(options.timeout);
  }
  return units;
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

struct FullyShardedDataParallel::Offloaded {
  std::vector<at::Tensor> device;  // the shard pieces (impl_->pieces, flattened)
  std::vector<at::Tensor> host;    // what the optimizer steps
  std::vector<at::Tensor> grads;   // the pieces' reduced gradients, copied down
  int64_t copied_at = -1;          // the reduce-scatter count at the last copy
};

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> model,
                                                   comm::ProcessGroup& dp, FsdpOptions options) {
  TORCH_CHECK(model, "FullyShardedDataParallel: model is null");
  // Frozen parameters (requires_grad false) stay out of the units: whole on
  // every rank, never gathered, reduced or stepped. They are checked and
  // broadcast like the others, so replicas start identical.
  std::vector<ddp::NamedTensor> params;
  bool any_trainable = false;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    any_trainable = any_trainable || item.value().requires_grad();
    params.push_back({item.key() + (item.value().requires_grad() ? "" : " (frozen)"), item.value()});
  }
  TORCH_CHECK(!params.empty(), "FullyShardedDataParallel: the model has no parameters");
  TORCH_CHECK(any_trainable, "FullyShardedDataParallel: every parameter of the model is frozen (requires_grad "
              "false): there is nothing to shard or train");
  // A skeleton's placeholders hold nothing to compare or send, and the
  // broadcast would make them whole (Note [Skeleton models]).
  if (!options.skeleton) {
    ddp::verify_same_tensors(dp, params, "parameters", options.timeout);
    std::vector<at::Tensor> values;
    for (const auto& p : params) values.push_back(p.tensor);
    for (const auto& b : ddp::module_buffers(*model)) values.push_back(b.tensor);
    // Buffers (BatchNorm statistics) stay replicated: taken from rank 0 here,
    // then each rank keeps its own (not sharded, not re-broadcast).
    ddp::broadcast_coalesced(dp, values, /*root=*/0, options.timeout);
  }

  std::vector<FlatUnit> units = build_units(*model, dp, options);
  const bool offload = options.offload;
  impl_ = std::make_shared<Impl>(std::move(model), dp, std::move(options), std::move(units));
  impl_->reshard_all();
  impl_->observe_this_thread();
  if (offload) {
    offload_ = std::make_shared<Offloaded>();
    at::NoGradGuard no_grad;
    for (const auto& unit_pieces : impl_->pieces) {
      for (const at::Tensor& piece : unit_pieces) {
        // Pinned: the copies between it and the GPU need no staging buffer.
        const auto host = piece.options().device(at::kCPU).pinned_memory(!piece.is_cpu()).requires_grad(false);
        at::Tensor copy = at::empty(piece.sizes(), host);
        copy.copy_(piece.detach());
        copy.set_requires_grad(true);
        offload_->device.push_back(piece);
        offload_->host.push_back(copy);
        offload_->grads.push_back(at::zeros(piece.sizes(), host));
      }
    }
  }
}

// Every piece's gradient queued down at once, then one wait for them all
// (clipping and the step read them on the host). The device's copy is
// dropped once down: the reduction adds into a piece's .grad, and the
// optimizer's zero_grad() now reaches only the host's. A piece no gradient
// reached (find_unused_parameters) gets zero, as on the device. Once per
// synchronized backward (the reduce-scatters it launched), however often
// this is called.
void FullyShardedDataParallel::copy_grads_down() {
  const int64_t launches = impl_->reduce_scatters();
  if (launches == offload_->copied_at) return;
  offload_->copied_at = launches;
  at::NoGradGuard no_grad;
  std::optional<c10::Device> device;
  for (std::size_t k = 0; k < offload_->device.size(); ++k) {
    const at::Tensor& g = offload_->device[k].grad();
    at::Tensor& grad = offload_->host[k].mutable_grad();
    // Several synchronized backwards before one step add up, as the
    // reduction's own .grad does (grad_sink.h); after zero_grad() (in place
    // in LibTorch 1.13, None in 2.x) the copy starts afresh.
    const bool accumulate = grad.defined() && grad.is_same(offload_->grads[k]);
    if (!g.defined()) {
      if (!accumulate) offload_->grads[k].zero_();
    } else if (accumulate) {
      offload_->grads[k].add_(g.to(at::kCPU));
    } else {
      offload_->grads[k].copy_(g, /*non_blocking=*/true);
      if (!g.is_cpu()) device = g.device();
    }
    if (!accumulate) grad = offload_->grads[k];
  }
  if (device) c10::impl::VirtualGuardImpl(device->type()).getStream(*device).synchronize();
  for (const at::Tensor& piece : offload_->device) piece.mutable_grad().reset();  // down now
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  impl_.reset();
  release_idle_observer();
}

const std::shared_ptr<torch::nn::Module>& FullyShardedDataParallel::module() const { return impl_->model; }
comm::ProcessGroup& FullyShardedDataParallel::group() { return impl_->group; }

std::vector<at::Tensor> FullyShardedDataParallel::optimizer_params() const {
  if (offload_) return offload_->host;
  std::vector<at::Tensor> out;
  for (const auto& unit_pieces : impl_->pieces) out.insert(out.end(), unit_pieces.begin(), unit_pieces.end());
  return out;
}

std::vector<TensorSlot> FullyShardedDataParallel::parameter_slots() const {
  std::vector<TensorSlot> out;
  for (std::size_t u = 0; u < impl_->units.size(); ++u) {
    const FlatUnit& unit = impl_->units[u];
    for (std::size_t k = 0; k < unit.pieces().size(); ++k) {
      const ShardPiece& piece = unit.pieces()[k];
      const UnitParam& param = unit.params()[piece.param];
      out.push_back({param.name, param.tensor.sizes().vec(), piece.param_begin, impl_->pieces[u][k], true});
    }
  }
  return out;
}

void FullyShardedDataParallel::prepare_forward() { impl_->prepare_forward(); }

at::Tensor FullyShardedDataParallel::forward(const std::function<at::Tensor()>& forward) {
  prepare_forward();
  at::Tensor out = forward();
  if (!at::GradMode::is_enabled()) reshard();
  impl_->rethrow_kept_error();
  return out;
}

void FullyShardedDataParallel::finish_backward() {
  impl_->rethrow_kept_error();
  if (offload_ && impl_->sync_enabled()) copy_grads_down();
}

at::Tensor FullyShardedDataParallel::clip_grad_norm(double max_norm) {
  impl_->rethrow_kept_error();
  if (offload_ && impl_->sync_enabled()) copy_grads_down();  // a loop without finish_backward()
  std::vector<at::Tensor> grads;
  for (const at::Tensor& piece : optimizer_params()) {
    if (piece.grad().defined()) grads.push_back(piece.grad());
  }
  at::NoGradGuard no_grad;
  const auto options = impl_->units.front().shard().options();
  // Sum of squares over this rank's pieces, then over ranks: the square of
  // the norm over the whole (unsharded) gradient. Nothing is read on the
  // host (Note [Clipping without a sync] in optim/clip.h).
  at::Tensor sum_sq = at::zeros({1}, options);
  for (const at::Tensor& g : grads) sum_sq.add_(g.pow(2).sum());
  impl_->group.all_reduce(sum_sq, comm::ReduceOp::kSum)->wait(impl_->options.timeout);
  const at::Tensor total = sum_sq.to(at::kDouble).sqrt().reshape({});
  optim::scale_by_coefficient(grads, optim::clip_coefficient(total, max_norm));
  return total;
}

void FullyShardedDataParallel::step(torch::optim::Optimizer& optimizer) {
  impl_->rethrow_kept_error();
  if (!impl_->sync_enabled()) {
    throw Error(fmt::format("rank {}: FullyShardedDataParallel::step() inside no_sync(): the shards hold no "
                            "reduced gradient yet (the accumulated ones are this rank's own). End the no_sync() "
                            "scope before the last micro-batch's forward and backward, then step",
                            group().rank()));
  }
  if (offload_) copy_grads_down();  // a loop without finish_backward(); once per backward anyway
  optimizer.step();
  if (offload_) {
    at::NoGradGuard no_grad;
    for (std::size_t k = 0; k < offload_->device.size(); ++k) offload_->device[k].detach().copy_(offload_->host[k]);
  }
  impl_->reshard_all();
}

void FullyShardedDataParallel::reshard() { impl_->reshard_all(); }

void FullyShardedDataParallel::after_load() {
  // Offload: what was loaded into the shards becomes the optimizer's copy.
  if (offload_) {
    at::NoGradGuard no_grad;
    for (std::size_t k = 0; k < offload_->device.size(); ++k) offload_->host[k].detach().copy_(offload_->device[k]);
  }
  reshard();
}

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(FullyShardedDataParallel& fsdp)
    : fsdp_(fsdp), previous_(fsdp.impl_->sync_enabled()) {
  fsdp_.impl_->set_sync_enabled(false);
}

FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() { fsdp_.impl_->set_sync_enabled(previous_); }

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallel::full_parameters() {
  impl_->rethrow_kept_error();
  at::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> by_name;
  for (FlatUnit& unit : impl_->units) {
    // A separate buffer: the unit's own state (freed or gathered) is untouched.
    at::Tensor full = at::empty({unit.padded_numel()}, unit.shard().options());
    impl_->group.all_gather(full, unit.shard())->wait(impl_->options.timeout);
    for (const UnitParam& p : unit.params()) {
      by_name[p.name] = full.narrow(0, p.offset, p.numel).view(p.tensor.sizes()).clone();
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : impl_->model->named_parameters(/*recurse=*/true)) {
    const auto it = by_name.find(item.key());
    out.emplace_back(item.key(), it != by_name.end() ? it->second : item.value().detach().clone());  // frozen: whole
  }
  return out;
}

ModelStateBytes FullyShardedDataParallel::model_state_bytes(const torch::optim::Optimizer* optimizer) const {
  ModelStateBytes bytes;
  for (std::size_t u = 0; u < impl_->units.size(); ++u) {
    FlatUnit& unit = impl_->units[u];
    bytes.params += bytes_of(unit.shard()) + static_cast<int64_t>(unit.gathered_bytes());
    for (const UnitParam& p : unit.params()) bytes.grads += bytes_of(p.tensor.grad());
    for (const at::Tensor& piece : impl_->pieces[u]) bytes.grads += bytes_of(piece.grad());
  }
  // Offload: the host copies count too (host and device bytes together, as ZeRO's).
  if (offload_) {
    bytes.params += tensor_bytes(offload_->host);
    bytes.grads += tensor_bytes(offload_->grads);
  }
  if (optimizer) bytes.optimizer_state = tensor_bytes(optimizer_state_tensors(*optimizer));
  return bytes;
}

std::vector<UnitInfo> FullyShardedDataParallel::units() const {
  std::vector<UnitInfo> out;
  for (const FlatUnit& unit : impl_->units) {
    UnitInfo info{unit.name(), {}, unit.numel(), unit.padded_numel(), unit.shard_numel(),
                  static_cast<int64_t>(unit.gathered_bytes())};
    for (const UnitParam& p : unit.params()) info.params.push_back(p.name);
    out.push_back(std::move(info));
  }
  return out;
}

FsdpStats FullyShardedDataParallel::stats() const {
  FsdpStats s = impl_->stats;
  s.reduce_scatters = impl_->reduce_scatters();
  return s;
}

}  // namespace paratrain::fsdp

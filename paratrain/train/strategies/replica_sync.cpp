// DDP, ZeRO or FSDP over the megatron strategy's replicas: see replica_sync.h.
#include "paratrain/train/strategies/replica_sync.h"

#include <torch/torch.h>

#include <algorithm>

#include "paratrain/core/error.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain::train::strategies {

// Note [FSDP over tensor-parallel shards]
// Under zero.stage = 3 each tp rank's module (its shards of the split
// layers, the replicated tensors whole) is FSDP-wrapped over its replicas
// (dp x cp), as one process's model would be over dp: FSDP sees plain
// parameters and never a tp collective. What makes the two axes compose:
// - Every tp rank of a replica has the same parameter shapes, so FSDP cuts
//   the same units and pieces on each (same flat offsets): a piece of a
//   replicated tensor covers the same elements on every tp rank, and
//   Megatron-SP's partial gradients can be summed over tp piece by piece
//   after the reduce-scatter (sums over tp and over replicas commute).
// - The units are gathered on touch (fsdp.cpp's Note [Gather on touch]) on
//   the thread that runs forward and backward, the thread that also runs the
//   tp and ring-attention collectives: the gathers of the replicas and the
//   tp collectives of a rank never interleave differently on its peers.
// - Checkpoints: a piece is a run of this tp rank's shard, which is itself
//   runs of the whole tensor (tp segments): sub_segments() places it.
// Not composed: pipeline stages (a chunk's units would be gathered once per
// micro-batch, and the tied embedding's copies are summed as whole
// gradients) and parallel.ep's experts, both ConfigErrors.

ReplicaSync::ReplicaSync(const TrainConfig& config, const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                         comm::ProcessGroup& replicas, std::chrono::milliseconds timeout,
                         moe::ExpertParallel* experts)
    : modules_(modules), experts_(experts) {
  if (config.zero.stage == 3 && (modules.size() != 1 || experts != nullptr))
    throw ConfigError("zero.stage = 3 in the megatron strategy shards one module without parallel.ep's experts "
                      "(parallel.pp = 1, parallel.ep = 1); the config check should have said so");
  const std::vector<at::Tensor> local_parameters = experts ? experts->local_parameters() : std::vector<at::Tensor>{};
  for (const auto& m : modules) {
    if (config.zero.stage == 3) {
      fsdp_.push_back(std::make_unique<fsdp::FullyShardedDataParallel>(m, replicas, fsdp_options(config, timeout)));
      no_sync_.emplace_back();
    } else if (config.zero.stage > 0) {
      zero::ZeroOptions options = zero_options(config, timeout);
      options.local_parameters = local_parameters;
      zero_.push_back(std::make_unique<zero::ZeroDataParallel>(m, replicas, std::move(options)));
    } else if (replicas.size() > 1) {
      ddp::DdpOptions options = ddp_options(config, timeout);
      options.local_parameters = local_parameters;
      ddp_.push_back(std::make_unique<ddp::DistributedDataParallel>(m, replicas, std::move(options)));
    }
  }
}

ReplicaSync::~ReplicaSync() = default;

std::vector<at::Tensor> ReplicaSync::optimizer_params() const {
  std::vector<at::Tensor> out;
  if (!fsdp_.empty()) {
    for (const auto& f : fsdp_) {
      const auto pieces = f->optimizer_params();
      out.insert(out.end(), pieces.begin(), pieces.end());
    }
    return out;
  }
  if (zero_.empty()) {
    for (const auto& m : modules_) {
      for (const auto& p : m->parameters())
        if (p.requires_grad()) out.push_back(p);  // frozen ones never step
    }
    return out;
  }
  for (const auto& z : zero_) out.insert(out.end(), z->optimizer_params().begin(), z->optimizer_params().end());
  if (experts_) out.insert(out.end(), experts_->parameters().begin(), experts_->parameters().end());
  return out;
}

void ReplicaSync::prepare_forward(int i) {
  if (!ddp_.empty()) ddp_[i]->prepare_forward();
  if (!zero_.empty()) zero_[i]->prepare_forward();
  if (!fsdp_.empty()) fsdp_[i]->prepare_forward();
}

void ReplicaSync::set_sync(int i, bool sync) {
  if (!ddp_.empty()) ddp_[i]->reducer().set_sync_enabled(sync);
  if (!zero_.empty()) zero_[i]->reducer().set_sync_enabled(sync);
  if (!fsdp_.empty()) {
    if (sync) {
      no_sync_[i].reset();
    } else if (!no_sync_[i]) {
      no_sync_[i] = std::make_unique<fsdp::FullyShardedDataParallel::NoSyncGuard>(*fsdp_[i]);
    }
  }
}

void ReplicaSync::finish_backward(int i) {
  if (!ddp_.empty()) ddp_[i]->finish_backward();
  if (!zero_.empty()) zero_[i]->finish_backward();
  if (!fsdp_.empty()) fsdp_[i]->finish_backward();
}

pipeline::ExecutorHooks ReplicaSync::hooks(bool sync) {
  pipeline::ExecutorHooks hooks;
  if (ddp_.empty() && zero_.empty() && fsdp_.empty()) return hooks;
  hooks.before_forward = [this](int chunk) { prepare_forward(chunk); };
  hooks.before_backward = [this, sync](int chunk, bool last) { set_sync(chunk, sync && last); };
  hooks.after_backward = [this, sync](int chunk, bool last) {
    if (sync && last) finish_backward(chunk);
  };
  return hooks;
}

void ReplicaSync::finish_all() {
  for (auto& z : zero_) z->finish_backward();
}

std::vector<std::pair<at::Tensor, TensorSlot>> ReplicaSync::piece_slots() const {
  std::vector<std::pair<at::Tensor, TensorSlot>> out;
  for (const auto& z : zero_) {
    const auto slots = z->optimizer_param_slots();
    out.insert(out.end(), slots.begin(), slots.end());
  }
  for (const auto& f : fsdp_) {
    const auto params = f->optimizer_params();
    const auto slots = f->parameter_slots();
    for (size_t i = 0; i < params.size(); ++i) out.emplace_back(params[i], slots.at(i));
  }
  return out;
}

std::vector<std::pair<at::Tensor, std::string>> ReplicaSync::named_optimizer_params() const {
  std::vector<std::pair<at::Tensor, std::string>> out;
  if (!sharded()) {
    for (const auto& m : modules_) {
      for (const auto& item : m->named_parameters())
        if (item.value().requires_grad()) out.emplace_back(item.value(), item.key());
    }
    return out;
  }
  for (const auto& [param, slot] : piece_slots()) out.emplace_back(param, slot.name);
  if (experts_) {
    for (const auto& m : modules_) {
      for (const auto& item : m->named_parameters())
        if (experts_->holds(item.value()) && item.value().requires_grad()) out.emplace_back(item.value(), item.key());
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ReplicaSync::named_grads() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (!sharded()) {
    for (const auto& m : modules_) {
      for (const auto& item : m->named_parameters()) out.emplace_back(item.key(), item.value().grad());
    }
    return out;
  }
  for (const auto& [param, slot] : piece_slots()) out.emplace_back(slot.name, param.grad());
  return out;
}

std::vector<at::Tensor> ReplicaSync::stepped_parts(const std::set<std::string>& names) const {
  std::vector<at::Tensor> out;
  if (!sharded()) {
    for (const auto& m : modules_) {
      for (const auto& item : m->named_parameters())
        if (names.count(item.key())) out.push_back(item.value());
    }
    return out;
  }
  for (const auto& [param, slot] : piece_slots())
    if (names.count(slot.name)) out.push_back(param);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> ReplicaSync::module_parameters() {
  if (!fsdp_.empty()) return fsdp_.at(0)->full_parameters();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : modules_.at(0)->named_parameters()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

at::Tensor ReplicaSync::eval_forward(const std::function<at::Tensor()>& forward) {
  if (fsdp_.empty()) return forward();
  return fsdp_.at(0)->forward(forward);
}

void ReplicaSync::reshard() {
  for (auto& f : fsdp_) f->reshard();
}

void ReplicaSync::scale_gradients(double coef) {
  at::NoGradGuard no_grad;
  if (!fsdp_.empty()) {
    for (const auto& p : optimizer_params())
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    return;
  }
  if (!zero_.empty()) {
    for (auto& z : zero_) z->scale_gradients(coef);
    if (experts_) experts_->scale_gradients(coef);
    return;
  }
  for (const auto& m : modules_) {
    for (const auto& p : m->parameters()) {
      if (p.grad().defined()) p.grad().mul_(coef);
    }
  }
}

void ReplicaSync::step(torch::optim::Optimizer& optimizer) {
  if (!fsdp_.empty()) {
    // One module (pp = 1): its step frees the units gathered for backward.
    fsdp_.at(0)->step(optimizer);
    return;
  }
  if (zero_.empty()) {
    optimizer.step();
    return;
  }
  // One optimizer over every chunk's pieces: step it once, then each chunk
  // all-gathers its updated parameters (and clears its full gradients).
  for (auto& z : zero_) z->begin_step();
  optimizer.step();
  for (auto& z : zero_) z->end_step();
}

void ReplicaSync::clear_gradients(torch::optim::Optimizer& optimizer) {
  // A skipped FSDP step frees what backward gathered, as step() would.
  reshard();
  if (zero_.empty()) {
    optimizer.zero_grad();
    return;
  }
  if (!experts_) return;
  for (auto p : experts_->parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
}

std::vector<checkpoint::OptimizerSlot> ReplicaSync::optimizer_slots(const std::vector<TensorSlot>& model,
                                                        const std::function<bool(const std::string&)>& writes) const {
  std::vector<checkpoint::OptimizerSlot> out;
  if (!sharded()) {
    for (const auto& slot : model) {
      if (slot.local.requires_grad()) out.push_back(checkpoint::OptimizerSlot{slot.local, slot});  // not buffers
    }
    return out;
  }
  std::map<std::string, const TensorSlot*> by_name;
  for (const auto& slot : model) by_name[slot.name] = &slot;
  for (const auto& [param, piece] : piece_slots()) {
    const TensorSlot& whole = *by_name.at(piece.name);
    TensorSlot slot{piece.name, whole.global_shape, 0, piece.local, writes(piece.name)};
    slot.segments = sub_segments(whole, piece.flat_offset, piece.local.numel());
    out.push_back(checkpoint::OptimizerSlot{param, std::move(slot)});
  }
  // The experts, whole beside the pieces: their model slots (written by
  // their holders in ep group 0).
  if (experts_) {
    for (const auto& slot : model) {
      if (experts_->holds(slot.local) && slot.local.requires_grad())
        out.push_back(checkpoint::OptimizerSlot{slot.local, slot});
    }
  }
  return out;
}

std::vector<TensorSlot> ReplicaSync::model_slots(const std::vector<TensorSlot>& model,
                                                  const std::function<bool(const std::string&)>& writes) const {
  if (fsdp_.empty()) return model;
  // The trainable parameters' values are their pieces (the frozen ones and
  // the buffers stay whole: FSDP leaves them out of its units).
  std::vector<TensorSlot> out;
  for (const auto& slot : model) {
    if (!slot.local.requires_grad()) out.push_back(slot);
  }
  for (auto& piece : optimizer_slots(model, writes)) out.push_back(std::move(piece.slot));
  return out;
}

void ReplicaSync::after_load() {
  for (auto& z : zero_) z->gather_parameters();
  for (auto& f : fsdp_) f->after_load();
}

SyncStats ReplicaSync::stats() const {
  if (!ddp_.empty()) return sync_stats(ddp_[0]->last_step_stats());
  if (!zero_.empty()) return sync_stats(zero_[0]->reducer().last_step());
  return {};  // FSDP reduces unit by unit in backward: no bucket statistics
}

ModelStateBytes ReplicaSync::memory(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                                    const torch::optim::Optimizer& optimizer) const {
  if (!fsdp_.empty()) return fsdp_.at(0)->model_state_bytes(&optimizer);
  if (!zero_.empty()) {
    ModelStateBytes m = zero_chunks_memory(zero_, optimizer);
    if (experts_) {  // whole tensors beside the pieces
      m.params += tensor_bytes(experts_->local_parameters());
      m.grads += tensor_bytes(grads_of(experts_->parameters()));
    }
    return m;
  }
  ModelStateBytes m;
  for (const auto& mod : modules) {
    m.params += tensor_bytes(mod->parameters());
    m.grads += tensor_bytes(grads_of(mod->parameters()));
  }
  m.optimizer_state = tensor_bytes(optimizer_state_tensors(optimizer));
  return m;
}

std::vector<SlotSegment> sub_segments(const TensorSlot& model, int64_t offset, int64_t numel) {
  std::vector<SlotSegment> out;
  const int64_t end = offset + numel;
  for (const SlotSegment& s : slot_segments(model)) {
    const int64_t lo = std::max(offset, s.local_offset), hi = std::min(end, s.local_offset + s.numel);
    if (lo < hi) out.push_back({lo - offset, s.global_offset + (lo - s.local_offset), hi - lo});
  }
  return out;
}

}  // namespace paratrain::train::strategies

// DistributedDataParallel: see ddp.h.
#include "paratrain/data_parallel/ddp/ddp.h"

#include <torch/torch.h>

#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

constexpr int kSourceRank = 0;

std::vector<at::Tensor> tensors_of(const std::vector<NamedTensor>& named) {
  std::vector<at::Tensor> out;
  for (const auto& t : named) out.push_back(t.tensor);
  return out;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 comm::ProcessGroup& group, DdpOptions options)
    : module_(std::move(module)), group_(group), options_(std::move(options)) {
  TORCH_CHECK(module_ != nullptr, "DistributedDataParallel: module is null");
  std::unordered_set<const void*> local;
  for (const auto& t : options_.local_parameters) local.insert(t.unsafeGetTensorImpl());
  std::vector<NamedParameter> params;
  for (auto& p : trainable_parameters(*module_)) {
    if (!local.count(p.tensor.unsafeGetTensorImpl())) params.push_back(std::move(p));
  }
  buffers_ = module_buffers(*module_);

  // Every parameter, frozen ones included (replicas must be identical, not
  // just their trainable part); the frozen flag is part of the checked name.
  std::vector<NamedTensor> all_params;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (local.count(item.value().unsafeGetTensorImpl())) continue;
    all_params.push_back({item.key() + (item.value().requires_grad() ? "" : " (frozen)"), item.value()});
  }
  const auto timeout = options_.reducer.timeout;
  verify_same_tensors(group_, all_params, "parameters", timeout);
  verify_same_tensors(group_, buffers_, "buffers", timeout);
  broadcast_coalesced(group_, tensors_of(all_params), kSourceRank, timeout);
  broadcast_coalesced(group_, tensors_of(buffers_), kSourceRank, timeout);

  reducer_ = std::make_unique<Reducer>(std::move(params), group_, options_.reducer);
  // The first forward is prepared: parameters and buffers are rank 0's.
  reducer_->prepare_forward();
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::prepare_forward() {
  reducer_->prepare_forward();
  if (options_.broadcast_buffers && !std::exchange(buffers_fresh_, false)) sync_buffers();
}

void DistributedDataParallel::step(torch::optim::Optimizer& optimizer) {
  if (!reducer_->sync_enabled()) {
    throw Error(fmt::format("rank {}: DistributedDataParallel::step() inside no_sync(): the gradients are this "
                            "rank's own, so stepping on them lets the replicas drift apart. End the no_sync() "
                            "scope before the last micro-batch's forward and backward, then step",
                            group_.rank()));
  }
  finish_backward();
  optimizer.step();
  // The next forward needs nothing from the loop (Note [One wrapper protocol]).
  prepare_forward();
  buffers_fresh_ = true;
}

void DistributedDataParallel::sync_buffers() {
  if (buffers_.empty()) return;
  broadcast_coalesced(group_, tensors_of(buffers_), kSourceRank, options_.reducer.timeout);
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(Reducer& reducer)
    : reducer_(reducer), previous_(reducer.sync_enabled()) {
  reducer_.set_sync_enabled(false);
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { reducer_.set_sync_enabled(previous_); }

std::vector<NamedParameter> trainable_parameters(torch::nn::Module& module) {
  std::vector<NamedParameter> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!t.requires_grad()) continue;
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;  // shared parameter
    out.push_back({item.key(), t});
  }
  return out;
}

std::vector<NamedTensor> module_buffers(torch::nn::Module& module) {
  std::vector<NamedTensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    const at::Tensor& t = item.value();
    if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
    out.push_back({item.key(), t});
  }
  return out;
}

}  // namespace paratrain::ddp

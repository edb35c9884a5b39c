// NaiveDataParallel: see naive.h.
#include "paratrain/data_parallel/ddp/naive.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"

namespace paratrain::ddp {
namespace {

std::vector<at::Tensor> tensors_of(const std::vector<NamedTensor>& named) {
  std::vector<at::Tensor> out;
  for (const auto& t : named) out.push_back(t.tensor);
  return out;
}

}  // namespace

NaiveDataParallel::NaiveDataParallel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroup& group,
                                     NaiveOptions options)
    : module_(std::move(module)), group_(group), options_(options) {
  TORCH_CHECK(module_ != nullptr, "NaiveDataParallel: module is null");
  params_ = trainable_parameters(*module_);
  buffers_ = module_buffers(*module_);
  std::vector<NamedTensor> all_params;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    all_params.push_back({item.key() + (item.value().requires_grad() ? "" : " (frozen)"), item.value()});
  }
  verify_same_tensors(group_, all_params, "parameters", options_.timeout);
  verify_same_tensors(group_, buffers_, "buffers", options_.timeout);
  broadcast_coalesced(group_, tensors_of(all_params), 0, options_.timeout);
  broadcast_coalesced(group_, tensors_of(buffers_), 0, options_.timeout);
}

void NaiveDataParallel::prepare_forward() {
  if (options_.broadcast_buffers && !buffers_.empty()) {
    broadcast_coalesced(group_, tensors_of(buffers_), 0, options_.timeout);
  }
}

void NaiveDataParallel::sync_gradients() {
  torch::NoGradGuard no_grad;
  const int world = group_.size();
  for (const auto& p : params_) {
    at::Tensor& grad = p.tensor.mutable_grad();
    if (!grad.defined()) {
      throw Error(fmt::format("rank {}: NaiveDataParallel: parameter '{}' has no gradient; every "
                              "parameter must get one before sync_gradients()",
                              group_.rank(), p.name));
    }
    // Collectives need contiguous tensors; autograd's are, but a user's may not be.
    at::Tensor buf = grad.is_contiguous() ? grad : grad.contiguous();
    group_.all_reduce(buf, comm::ReduceOp::kSum)->wait(options_.timeout);
    buf.div_(world);
    if (!buf.is_same(grad)) grad.copy_(buf);
  }
}

}  // namespace paratrain::ddp

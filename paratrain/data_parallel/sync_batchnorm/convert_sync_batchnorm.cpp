// convert_sync_batchnorm: a recursive walk over the module tree that swaps
// BatchNorm children for SyncBatchNorm in both the registry and, for
// containers, the list their forward iterates.
#include "paratrain/data_parallel/sync_batchnorm/convert_sync_batchnorm.h"

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/torch.h>

#include <string>

#include "paratrain/data_parallel/sync_batchnorm/sync_batchnorm.h"

namespace paratrain::sync_batchnorm {
namespace {

std::shared_ptr<SyncBatchNormImpl> from_batchnorm(const torch::nn::Module& module, comm::ProcessGroup& group,
                                                  const ConvertOptions& options);
void convert_children(torch::nn::Module& parent, const std::string& path, comm::ProcessGroup& group,
                      const ConvertOptions& options);

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          comm::ProcessGroup& group, ConvertOptions options) {
  TORCH_CHECK(module, "convert_sync_batchnorm: the module is null");
  if (auto sync = from_batchnorm(*module, group, options)) return sync;
  convert_children(*module, "", group, options);
  return module;
}

namespace {

template <typename BatchNormImpl>
std::shared_ptr<SyncBatchNormImpl> convert_one(const BatchNormImpl& bn, comm::ProcessGroup& group,
                                               const ConvertOptions& options) {
  const auto& o = bn.options;
  // c10::optional is not std::optional in LibTorch 1.13.
  const std::optional<double> momentum = o.momentum() ? std::optional<double>(*o.momentum()) : std::nullopt;
  auto sync = std::make_shared<SyncBatchNormImpl>(SyncBatchNormOptions{.num_features = o.num_features(),
                                                                       .eps = o.eps(),
                                                                       .momentum = momentum,
                                                                       .affine = o.affine(),
                                                                       .track_running_stats = o.track_running_stats(),
                                                                       .timeout = options.timeout},
                                                  group);
  const at::Tensor& any = o.affine() ? bn.weight : bn.running_mean;
  if (any.defined()) sync->to(any.device());
  torch::NoGradGuard no_grad;
  if (o.affine()) {
    sync->weight.copy_(bn.weight);
    sync->bias.copy_(bn.bias);
    sync->weight.set_requires_grad(bn.weight.requires_grad());
    sync->bias.set_requires_grad(bn.bias.requires_grad());
  }
  if (o.track_running_stats()) {
    sync->running_mean.copy_(bn.running_mean);
    sync->running_var.copy_(bn.running_var);
    sync->num_batches_tracked.copy_(bn.num_batches_tracked);
  }
  sync->train(bn.is_training());
  return sync;
}

std::shared_ptr<SyncBatchNormImpl> from_batchnorm(const torch::nn::Module& module, comm::ProcessGroup& group,
                                                  const ConvertOptions& options) {
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module)) return convert_one(*bn, group, options);
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module)) return convert_one(*bn, group, options);
  if (const auto* bn = dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module)) return convert_one(*bn, group, options);
  return nullptr;
}

// Replaces child number `index` (registered as `name`) of `parent`. Each
// container keeps its own list beside the registry; both must change.
void replace_child(torch::nn::Module& parent, std::size_t index, const std::string& name,
                   const std::shared_ptr<torch::nn::Module>& old_child, std::shared_ptr<SyncBatchNormImpl> sync,
                   const std::string& path, const ConvertOptions& options) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    // Sequential registers its modules in list order.
    TORCH_CHECK(index < seq->size() && seq->ptr(index) == old_child,
                "convert_sync_batchnorm: Sequential '", path, "' lists its modules in another order than it "
                "registered them");
    *(seq->begin() + static_cast<std::ptrdiff_t>(index)) = torch::nn::AnyModule(sync);
    parent.replace_module(name, sync);
    return;
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    TORCH_CHECK(index < list->size() && list->ptr(index) == old_child,
                "convert_sync_batchnorm: ModuleList '", path, "' lists its modules in another order than it "
                "registered them");
    *(list->begin() + static_cast<std::ptrdiff_t>(index)) = sync;
    parent.replace_module(name, sync);
    return;
  }
  if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent); dict && dict->contains(name)) {
    dict->update(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{{name, sync}});
    return;
  }
  TORCH_CHECK(options.allow_plain_parents, "convert_sync_batchnorm: '", path, name, "' is a BatchNorm registered on ",
              parent.name(), ", whose forward calls it through its own member, which conversion cannot "
              "reassign (the layer would stay unsynchronized). Build it as a SyncBatchNorm, hold it in a "
              "Sequential/ModuleList/ModuleDict, or set ConvertOptions::allow_plain_parents if the module "
              "reads its children by name.");
  parent.replace_module(name, sync);
}

void convert_children(torch::nn::Module& parent, const std::string& path, comm::ProcessGroup& group,
                      const ConvertOptions& options) {
  std::size_t index = 0;
  for (const auto& item : parent.named_children()) {
    const std::string& name = item.key();
    const std::shared_ptr<torch::nn::Module>& child = item.value();
    if (auto sync = from_batchnorm(*child, group, options)) {
      replace_child(parent, index, name, child, std::move(sync), path, options);
    } else {
      convert_children(*child, path + name + ".", group, options);
    }
    ++index;
  }
}

}  // namespace
}  // namespace paratrain::sync_batchnorm

// convert_sync_batchnorm: replaces every torch::nn::BatchNorm{1,2,3}d inside
// an existing model by a SyncBatchNorm over a group, as PyTorch's
// SyncBatchNorm.convert_sync_batchnorm. Not here: the layer itself
// (sync_batchnorm.h).
//
//   model = convert_sync_batchnorm(model, dp);   // before building the optimizer
#pragma once

#include <chrono>
#include <memory>

#include "paratrain/comm/process_group.h"

namespace torch::nn {
class Module;
}

namespace paratrain::sync_batchnorm {

/// Options of convert_sync_batchnorm().
struct ConvertOptions {
  /// Collective timeout of the new SyncBatchNorm modules.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  /// LibTorch modules call their children through member holders
  /// (`bn->forward(x)`), which a conversion cannot reassign: only containers
  /// (Sequential, ModuleList, ModuleDict) dispatch through their registry.
  /// false: a BatchNorm registered on any other module is an error naming it
  ///   (the conversion would silently leave that forward unsynchronized);
  ///   build such layers as SyncBatchNorm, or keep them in a Sequential.
  /// true: replace it in the registry anyway (parameters(), state dicts and
  ///   named_children() see the new module), for modules whose forward looks
  ///   children up by name or re-reads them after conversion.
  bool allow_plain_parents = false;
};

/// Walks `module` recursively and replaces each BatchNorm1d/2d/3d by a
/// SyncBatchNorm under the same name, with the same options, train/eval mode,
/// device, parameter values (and requires_grad) and running statistics. The
/// new modules own new tensors: build the optimizer after converting (as
/// after any module replacement). Returns the converted model: `module`
/// itself, changed in place, or a new SyncBatchNorm if `module` is a
/// BatchNorm. Not a collective (no communication), but every rank must
/// convert the same model. Throws c10::Error (TORCH_CHECK) for a BatchNorm
/// under a plain module without allow_plain_parents; the model is then left
/// partly converted.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          comm::ProcessGroup& group, ConvertOptions options = {});

}  // namespace paratrain::sync_batchnorm

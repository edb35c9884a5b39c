// SyncBatchNorm: batch normalization whose training-mode batch statistics are
// those of the whole data-parallel batch (every rank's samples), as PyTorch's
// torch.nn.SyncBatchNorm, for LibTorch's C++ frontend which has none.
// Not here: replacing BatchNorm modules in an existing model
// (convert_sync_batchnorm.h), averaging weight/bias gradients over ranks
// (DDP's job, as for any parameter).
//
//   auto bn = SyncBatchNorm(SyncBatchNormOptions{.num_features = 16}, dp);
//   y = bn->forward(x);      // x: [N, C], [N, C, L], [N, C, H, W] or [N, C, D, H, W]
//
// Namespace paratrain::sync_batchnorm (the folder's name, as ddp/zero/fsdp).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <cstdint>
#include <optional>

#include "paratrain/comm/process_group.h"

namespace paratrain::sync_batchnorm {

struct SyncBatchNormOptions {
  // Channels: input.size(1).
  int64_t num_features = 0;
  // Added to the variance before the square root, as BatchNorm.
  double eps = 1e-5;
  // Weight of the new batch in the running statistics; nullopt: cumulative
  // average over all batches so far (1 / num_batches_tracked), as BatchNorm.
  std::optional<double> momentum = 0.1;
  // Learnable per-channel weight (init 1) and bias (init 0).
  bool affine = true;
  // Keep running_mean/running_var for eval mode. Without them eval mode
  // normalizes with this rank's own batch statistics and does not
  // communicate (as PyTorch's SyncBatchNorm).
  bool track_running_stats = true;
  // Longest wait for each of the two collectives (forward, backward).
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

// Training mode: per-channel sum, sum of squares and count of this rank's
// batch are all-reduced in one collective (so ranks may hold different batch
// sizes, even zero), the input is normalized with the global mean and biased
// variance, and the running statistics take the unbiased global variance.
// Backward all-reduces the per-channel sums of dy and dy*xhat (times the
// weight) in one collective, so the input gradient is that of BatchNorm on
// the concatenated batch. The weight/bias gradients are this rank's share (their sum over
// ranks is the concatenated batch's), to be combined by DDP like any other
// parameter gradient.
// Every rank of the group must run forward (and backward) through the same
// SyncBatchNorm layers in the same order: each is a collective.
// Eval mode with running statistics: BatchNorm's eval, no communication.
// Parameters and buffers carry torch::nn::BatchNorm's names (weight, bias,
// running_mean, running_var, num_batches_tracked) so checkpoints interchange.
// The group is not owned and must outlive the module; clone() shares it.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  SyncBatchNormImpl(SyncBatchNormOptions options, comm::ProcessGroup& group);

  at::Tensor forward(const at::Tensor& input);

  // (Re)creates parameters and buffers: weight 1, bias 0, mean 0, var 1.
  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  comm::ProcessGroup& group() const { return *group_; }

  SyncBatchNormOptions options;
  at::Tensor weight;               // [C], undefined unless affine
  at::Tensor bias;                 // [C], undefined unless affine
  at::Tensor running_mean;         // [C], undefined unless track_running_stats
  at::Tensor running_var;          // [C], undefined unless track_running_stats
  at::Tensor num_batches_tracked;  // int64 scalar, undefined unless track_running_stats

 private:
  comm::ProcessGroup* group_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace paratrain::sync_batchnorm

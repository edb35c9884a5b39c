// SyncBatchNorm's module and its autograd function: global batch statistics
// in forward, globally reduced gradient sums in backward.
// Not here: converting existing models (convert_sync_batchnorm.cpp).
#include "paratrain/data_parallel/sync_batchnorm/sync_batchnorm.h"

#include <torch/autograd.h>
#include <torch/nn/init.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <ostream>
#include <vector>

namespace paratrain::sync_batchnorm {
namespace {

using torch::autograd::AutogradContext;

// What forward tells the module (for the running statistics) and what the
// autograd function needs: the group and the global statistics.
struct SyncArgs {
  comm::ProcessGroup* group;
  std::chrono::milliseconds timeout;
  double eps;
};
struct GlobalStats {
  at::Tensor mean;  // [C] float64
  at::Tensor var;   // [C] float64, biased (divided by count)
  double count = 0;
};

// The reduction dimensions (all but the channel dim 1) and the shape that
// broadcasts a [C] vector against the input.
std::vector<int64_t> reduce_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}
std::vector<int64_t> channel_shape(const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return shape;
}

// Global statistics in one collective: each rank sends count * mean and
// count * (var + mean^2) per channel, computed from its own numerically
// stable var_mean and promoted to float64; their sums give the global mean
// and E[x^2], and var = E[x^2] - mean^2 loses only about
// eps_fp32 * (1 + mean^2 / var) relative, far below our tolerances unless a
// channel's mean is thousands of standard deviations from zero. One
// collective of 2C + 1 values instead of PyTorch's all-gather of every
// rank's statistics (whose size grows with the world).
GlobalStats global_stats(const at::Tensor& input, const SyncArgs& args) {
  const int64_t channels = input.size(1);
  const double local_count = static_cast<double>(input.numel() / std::max<int64_t>(channels, 1));
  auto f64 = input.options().dtype(at::kDouble);
  at::Tensor packed = at::zeros({2 * channels + 1}, f64);
  if (local_count > 0) {
    auto [var, mean] = at::var_mean(input, reduce_dims(input), /*unbiased=*/false, /*keepdim=*/false);
    at::Tensor m = mean.to(at::kDouble);
    packed.slice(0, 0, channels).copy_(m * local_count);
    packed.slice(0, channels, 2 * channels).copy_((var.to(at::kDouble) + m * m) * local_count);
  }
  packed[2 * channels] = local_count;
  if (args.group->size() > 1) args.group->all_reduce(packed, comm::ReduceOp::kSum)->wait(args.timeout);

  GlobalStats stats;
  stats.count = packed[2 * channels].item<double>();
  TORCH_CHECK(stats.count > 1, "SyncBatchNorm: expected more than 1 value per channel when training, got ",
              stats.count, " over the group's ", args.group->size(), " ranks (input ", input.sizes(), ")");
  stats.mean = packed.slice(0, 0, channels) / stats.count;
  stats.var = (packed.slice(0, channels, 2 * channels) / stats.count - stats.mean * stats.mean).clamp_min(0);
  return stats;
}

// Normalizes with the global statistics: returns xhat = (x - mean) * invstd.
// The affine weight and bias are applied outside, with ordinary autograd
// ops (their gradients are this rank's sums; see the header), which keeps
// this function's inputs to the one tensor that needs a collective backward
// (custom functions cannot take undefined tensors, which affine = false has).
class SyncNormalize : public torch::autograd::Function<SyncNormalize> {
 public:
  // `stats_out` receives the global statistics for the running averages.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, SyncArgs args, GlobalStats* stats_out) {
    GlobalStats stats = global_stats(input, args);
    const auto shape = channel_shape(input);
    at::Tensor mean = stats.mean.to(input.scalar_type());
    at::Tensor invstd = (stats.var + args.eps).rsqrt().to(input.scalar_type());
    at::Tensor xhat = (input - mean.view(shape)) * invstd.view(shape);
    // xhat is kept anyway by the affine multiply after us; saving it (not
    // the input) costs no extra memory.
    ctx->save_for_backward({xhat, invstd});
    ctx->saved_data["count"] = stats.count;
    // saved_data holds IValues only (capsules are deprecated); the group
    // outlives the module by contract, so its address is a safe handle.
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(args.group);
    ctx->saved_data["timeout_ms"] = static_cast<int64_t>(args.timeout.count());
    *stats_out = std::move(stats);
    return xhat;
  }

  // With g = dL/dxhat (= w * dy) and N the global count, BatchNorm's input
  // gradient is
  //   dx = invstd * (g - sum(g) / N - xhat * sum(g * xhat) / N)
  // where both sums run over the whole global batch: the only values that
  // need communication, 2C of them in one all-reduce. (Per channel these are
  // w * sum(dy) and w * sum(dy * xhat).)
  static torch::autograd::variable_list backward(AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& xhat = saved[0];
    const at::Tensor& invstd = saved[1];
    const double count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const std::chrono::milliseconds timeout{ctx->saved_data["timeout_ms"].toInt()};

    const at::Tensor g = grads[0].contiguous();
    const auto shape = channel_shape(xhat);
    const auto dims = reduce_dims(xhat);
    const int64_t channels = xhat.size(1);
    at::Tensor packed = at::cat({g.sum(dims), (g * xhat).sum(dims)}).to(at::kDouble);
    if (group->size() > 1) group->all_reduce(packed, comm::ReduceOp::kSum)->wait(timeout);
    const at::Tensor mean_g = (packed.slice(0, 0, channels) / count).to(xhat.scalar_type());
    const at::Tensor mean_g_xhat = (packed.slice(0, channels, 2 * channels) / count).to(xhat.scalar_type());
    at::Tensor grad_input = (g - mean_g.view(shape) - xhat * mean_g_xhat.view(shape)) * invstd.view(shape);
    return {grad_input, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, comm::ProcessGroup& group)
    : options(options_), group_(&group) {
  TORCH_CHECK(options.num_features > 0, "SyncBatchNormOptions::num_features must be positive, got ",
              options.num_features);
  reset();
}

void SyncBatchNormImpl::reset() {
  // The same registrations as torch::nn::BatchNorm (NormImplBase::reset),
  // undefined tensors included, so state dicts have the same keys.
  const int64_t c = options.num_features;
  if (options.affine) {
    weight = register_parameter("weight", torch::empty({c}));
    bias = register_parameter("bias", torch::empty({c}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats) return;
  torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine) return;
  torch::nn::init::ones_(weight);
  torch::nn::init::zeros_(bias);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("paratrain::SyncBatchNorm({}, eps={}, momentum={}, affine={}, track_running_stats={}, "
                        "group_size={})",
                        options.num_features, options.eps,
                        options.momentum ? fmt::format("{}", *options.momentum) : std::string("None"),
                        options.affine, options.track_running_stats, group_->size());
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2 && input.dim() <= 5,
              "SyncBatchNorm: expected a 2D to 5D input ([N, C, ...]), got ", input.dim(), "D");
  TORCH_CHECK(input.size(1) == options.num_features, "SyncBatchNorm: input has ", input.size(1),
              " channels, the module ", options.num_features);
  if (!is_training()) {
    // Running statistics, or this rank's own batch without them: no
    // communication either way (PyTorch's SyncBatchNorm does the same).
    const bool use_batch_stats = !options.track_running_stats;
    return at::batch_norm(input, weight, bias, running_mean, running_var, use_batch_stats, /*momentum=*/0.0,
                          options.eps, /*cudnn_enabled=*/false);
  }

  GlobalStats stats;
  at::Tensor out = SyncNormalize::apply(input.contiguous(), SyncArgs{group_, options.timeout, options.eps}, &stats);
  if (options.affine) {
    const auto shape = channel_shape(input);
    out = out * weight.view(shape) + bias.view(shape);
  }
  if (options.track_running_stats) {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
    const double factor =
        options.momentum ? *options.momentum : 1.0 / num_batches_tracked.item<double>();
    // The running variance is the unbiased estimate over the global batch.
    const at::Tensor unbiased = stats.var * (stats.count / (stats.count - 1));
    running_mean.mul_(1 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
    running_var.mul_(1 - factor).add_(unbiased.to(running_var.scalar_type()), factor);
  }
  return out;
}

}  // namespace paratrain::sync_batchnorm

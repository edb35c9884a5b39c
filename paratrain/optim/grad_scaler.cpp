// GradScaler: loss scaling with a found-inf flag agreed over process groups.
// See grad_scaler.h for the step protocol; the update rule is PyTorch's
// _amp_update_scale_ (backoff on inf, growth after growth_interval good steps,
// never grow to a non-finite scale).
#include "paratrain/optim/grad_scaler.h"

#include <torch/optim/optimizer.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "paratrain/core/error.h"

namespace paratrain::optim {
namespace {

constexpr char kLossScaleKey[] = "precision.loss_scale";
constexpr char kScaleEntry[] = "scale";
constexpr char kTrackerEntry[] = "growth_tracker";

ConfigError loss_scale_error(std::string_view value, std::string_view why) {
  return ConfigError(fmt::format("{} = \"{}\" {}; allowed: \"dynamic\" (scale grows and backs off), "
                                 "\"none\" (no loss scaling), or a positive finite number such as "
                                 "\"1024\" (a static scale)",
                                 kLossScaleKey, value, why));
}

// Unscales one gradient in place and raises `flag` (a 1-element fp32 tensor
// on the gradient's device) to 1 if it holds inf/nan, without a host sync.
// fp16/bf16 gradients are multiplied in fp32 (as PyTorch's
// _amp_foreach_non_finite_check_and_unscale_) so 1/scale does not round.
void unscale_one(at::Tensor& grad, double inv_scale, at::Tensor& flag) {
  TORCH_CHECK(grad.layout() == at::kStrided, "GradScaler::unscale_: sparse gradients are not supported");
  if (grad.numel() == 0) return;
  if (grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kDouble) {
    grad.mul_(static_cast<float>(inv_scale));
  } else {
    grad.copy_(grad.to(at::kFloat).mul_(static_cast<float>(inv_scale)));
  }
  flag.copy_(at::maximum(flag, grad.isfinite().logical_not().any().to(at::kFloat).to(flag.device()).view({1})));
}

const at::Tensor& entry(const std::vector<std::pair<std::string, at::Tensor>>& state, const char* name,
                        at::ScalarType dtype) {
  auto it = std::find_if(state.begin(), state.end(), [&](const auto& kv) { return kv.first == name; });
  if (it == state.end()) {
    throw CheckpointError(fmt::format("GradScaler::load_state: no '{}' entry; the checkpoint was not written "
                                      "with GradScaler::state() (start without it or fix the checkpoint)",
                                      name));
  }
  const at::Tensor& t = it->second;
  if (!t.defined() || t.numel() != 1 || t.scalar_type() != dtype) {
    throw CheckpointError(fmt::format("GradScaler::load_state: '{}' must be one {} value, got {}", name,
                                      c10::toString(dtype),
                                      t.defined() ? fmt::format("{} of {} values", c10::toString(t.scalar_type()),
                                                                t.numel())
                                                  : std::string("an undefined tensor")));
  }
  return t;
}

}  // namespace

GradScalerOptions parse_loss_scale(std::string_view value, GradScalerOptions base) {
  if (value == "dynamic") {
    base.mode = GradScalerOptions::Mode::kDynamic;
    return base;
  }
  if (value == "none") {
    base.mode = GradScalerOptions::Mode::kNone;
    base.init_scale = 1.0;
    return base;
  }
  double number = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, number);
  if (value.empty() || ec != std::errc() || ptr != end) throw loss_scale_error(value, "is not a known form");
  if (!std::isfinite(number) || number <= 0) throw loss_scale_error(value, "is not a positive finite number");
  base.mode = GradScalerOptions::Mode::kStatic;
  base.init_scale = number;
  return base;
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(options.mode == GradScalerOptions::Mode::kNone ? 1.0 : options.init_scale) {
  TORCH_CHECK(std::isfinite(options_.init_scale) && options_.init_scale > 0,
              "GradScalerOptions::init_scale must be positive and finite, got ", options_.init_scale);
  TORCH_CHECK(options_.growth_factor > 1.0, "GradScalerOptions::growth_factor must be > 1, got ",
              options_.growth_factor);
  TORCH_CHECK(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0,
              "GradScalerOptions::backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  TORCH_CHECK(options_.growth_interval >= 1, "GradScalerOptions::growth_interval must be >= 1, got ",
              options_.growth_interval);
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (options_.mode == GradScalerOptions::Mode::kNone) return loss;
  return loss * scale_;
}

bool GradScaler::unscale_(const std::vector<at::Tensor>& grads, const std::vector<comm::ProcessGroup*>& groups,
                          std::chrono::milliseconds timeout) {
  TORCH_CHECK(phase_ != Phase::kStepped, "GradScaler::unscale_ after step() in the same step; call update() first");
  if (phase_ == Phase::kUnscaled) {
    // PyTorch keeps one unscale per optimizer per step; a repeat would divide
    // twice. Allowed as a no-op, but only for gradients already unscaled.
    for (const at::Tensor& g : grads) {
      if (!g.defined()) continue;
      TORCH_CHECK(std::find(unscaled_.begin(), unscaled_.end(), g.unsafeGetTensorImpl()) != unscaled_.end(),
                  "GradScaler::unscale_ called twice in one step with a gradient the first call did not "
                  "unscale; one GradScaler serves one optimizer per step (pass all its gradients at once)");
    }
    return found_inf_;
  }
  phase_ = Phase::kUnscaled;
  found_inf_ = false;
  unscaled_.clear();
  if (options_.mode == GradScalerOptions::Mode::kNone) return false;

  // 1/scale in double, rounded once to fp32, as PyTorch does.
  const double inv_scale = 1.0 / scale_;
  // The flag lives on the first gradient's device (a CUDA group needs CUDA
  // tensors; a rank without gradients uses the CPU) and is read once, after
  // the reductions: one host sync per step.
  at::Device device = at::kCPU;
  for (const at::Tensor& g : grads) {
    if (g.defined()) {
      device = g.device();
      break;
    }
  }
  at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (at::Tensor g : grads) {
    if (!g.defined()) continue;
    unscaled_.push_back(g.unsafeGetTensorImpl());
    // Keep unscaling after an inf: every gradient leaves this call unscaled,
    // so a caller that inspects them sees consistent values.
    unscale_one(g, inv_scale, flag);
  }
  // Every rank joins the reductions, found inf or not, with or without
  // gradients.
  for (comm::ProcessGroup* group : groups) {
    if (group == nullptr || group->size() == 1) continue;
    group->all_reduce(flag, comm::ReduceOp::kMax)->wait(timeout);
  }
  found_inf_ = flag.item<float>() != 0.0f;
  return found_inf_;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer, const std::vector<comm::ProcessGroup*>& groups,
                      std::chrono::milliseconds timeout) {
  TORCH_CHECK(phase_ != Phase::kStepped, "GradScaler::step() called twice in one step; call update() in between");
  if (phase_ == Phase::kReady) {
    std::vector<at::Tensor> grads;
    for (const auto& param_group : optimizer.param_groups()) {
      for (const at::Tensor& p : param_group.params()) {
        if (p.grad().defined()) grads.push_back(p.grad());
      }
    }
    unscale_(grads, groups, timeout);
  }
  phase_ = Phase::kStepped;
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  TORCH_CHECK(phase_ != Phase::kReady,
              "GradScaler::update() without unscale_() or step() in this step: no inf check was recorded");
  if (options_.mode == GradScalerOptions::Mode::kDynamic) {
    if (found_inf_) {
      scale_ *= options_.backoff_factor;
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == options_.growth_interval) {
      const double grown = scale_ * options_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    }
  }
  phase_ = Phase::kReady;
  found_inf_ = false;
  unscaled_.clear();
}

std::vector<std::pair<std::string, at::Tensor>> GradScaler::state() const {
  return {{kScaleEntry, at::full({1}, scale_, at::kDouble)},
          {kTrackerEntry, at::full({1}, growth_tracker_, at::kLong)}};
}

void GradScaler::load_state(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  TORCH_CHECK(phase_ == Phase::kReady, "GradScaler::load_state in the middle of a step; call it after update()");
  const double scale = entry(state, kScaleEntry, at::kDouble).item<double>();
  const int64_t tracker = entry(state, kTrackerEntry, at::kLong).item<int64_t>();
  if (!std::isfinite(scale) || scale <= 0 || tracker < 0) {
    throw CheckpointError(fmt::format("GradScaler::load_state: scale {} / growth_tracker {} out of range "
                                      "(scale must be positive and finite, the tracker >= 0)",
                                      scale, tracker));
  }
  // kNone stays a pass-through whatever was saved.
  if (options_.mode != GradScalerOptions::Mode::kNone) scale_ = scale;
  growth_tracker_ = tracker;
}

}  // namespace paratrain::optim

// LrSchedule: batch-size scaling, warmup and decay as closed-form functions of
// the step; see lr_schedule.h for the formulas and their sources.
#include "paratrain/optim/lr_schedule.h"

#include <torch/optim/optimizer.h>

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::optim {
namespace {

[[noreturn]] void bad(std::string_view key, const std::string& what) {
  throw ConfigError(fmt::format("invalid configuration: {} {}", key, what));
}

// k = global_batch / base_batch (linear) or its square root; 1 without scaling.
// Call after the batch fields were checked (base_batch > 0 when scaling).
double scale_factor(const LrScheduleOptions& o) {
  if (o.scaling == LrScheduleOptions::Scaling::kNone) return 1.0;
  const double k = static_cast<double>(o.global_batch) / static_cast<double>(o.base_batch);
  return o.scaling == LrScheduleOptions::Scaling::kSqrt ? std::sqrt(k) : k;
}

}  // namespace

void LrScheduleOptions::validate() const {
  if (!std::isfinite(base_lr) || base_lr < 0)
    bad("lr.base_lr", fmt::format("must be a finite rate >= 0, got {}", base_lr));
  if (base_batch < 0) bad("lr.base_batch", fmt::format("must be >= 0 (0 = no scaling), got {}", base_batch));
  if (global_batch < 0) bad("lr.global_batch", fmt::format("must be >= 0, got {}", global_batch));
  if (scaling != Scaling::kNone) {
    if (base_batch == 0)
      bad("lr.base_batch", fmt::format("must be > 0 with lr.scaling = \"{}\" (the batch lr.base_lr was tuned for); "
                                       "or set lr.scaling = \"none\"",
                                       to_string(scaling)));
    if (global_batch <= 0)
      bad("lr.global_batch", fmt::format("must be > 0 with lr.scaling = \"{}\", got {}", to_string(scaling),
                                         global_batch));
  }
  if (warmup_steps < 0) bad("lr.warmup_steps", fmt::format("must be >= 0 (0 = no warmup), got {}", warmup_steps));
  if (!(warmup_start_factor >= 0 && warmup_start_factor <= 1))
    bad("lr.warmup_start_factor", fmt::format("must be in [0, 1], got {}", warmup_start_factor));
  switch (decay) {
    case Decay::kConstant: break;
    case Decay::kCosine:
      if (total_steps <= warmup_steps)
        bad("lr.total_steps", fmt::format("must be > lr.warmup_steps ({}) with lr.decay = \"cosine\", got {}",
                                          warmup_steps, total_steps));
      if (!std::isfinite(min_lr) || min_lr < 0)
        bad("lr.min_lr", fmt::format("must be a finite rate >= 0, got {}", min_lr));
      if (min_lr > base_lr * scale_factor(*this))
        bad("lr.min_lr", fmt::format("({}) must not exceed the peak rate {} (lr.base_lr after lr.scaling)", min_lr,
                                     base_lr * scale_factor(*this)));
      break;
    case Decay::kStep:
      if (step_size <= 0)
        bad("lr.step_size", fmt::format("must be > 0 with lr.decay = \"step\", got {}", step_size));
      if (!(gamma > 0 && gamma <= 1)) bad("lr.gamma", fmt::format("must be in (0, 1], got {}", gamma));
      break;
  }
}

LrScheduleOptions::Scaling parse_lr_scaling(std::string_view text) {
  if (text == "none") return LrScheduleOptions::Scaling::kNone;
  if (text == "linear") return LrScheduleOptions::Scaling::kLinear;
  if (text == "sqrt") return LrScheduleOptions::Scaling::kSqrt;
  bad("lr.scaling", fmt::format("= \"{}\" is not allowed: use \"none\", \"linear\" or \"sqrt\"", text));
}

LrScheduleOptions::Decay parse_lr_decay(std::string_view text) {
  if (text == "constant") return LrScheduleOptions::Decay::kConstant;
  if (text == "cosine") return LrScheduleOptions::Decay::kCosine;
  if (text == "step") return LrScheduleOptions::Decay::kStep;
  bad("lr.decay", fmt::format("= \"{}\" is not allowed: use \"constant\", \"cosine\" or \"step\"", text));
}

std::string_view to_string(LrScheduleOptions::Scaling scaling) {
  switch (scaling) {
    case LrScheduleOptions::Scaling::kNone: return "none";
    case LrScheduleOptions::Scaling::kLinear: return "linear";
    case LrScheduleOptions::Scaling::kSqrt: return "sqrt";
  }
  return "?";
}

std::string_view to_string(LrScheduleOptions::Decay decay) {
  switch (decay) {
    case LrScheduleOptions::Decay::kConstant: return "constant";
    case LrScheduleOptions::Decay::kCosine: return "cosine";
    case LrScheduleOptions::Decay::kStep: return "step";
  }
  return "?";
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(options) {
  options_.validate();
  peak_ = options_.base_lr * scale_factor(options_);
}

double LrSchedule::lr(int64_t t) const {
  TORCH_CHECK(t >= 0, "LrSchedule::lr: step must be >= 0, got ", t);
  const LrScheduleOptions& o = options_;
  if (t < o.warmup_steps) {
    const double f = o.warmup_start_factor;
    return peak_ * (f + (1.0 - f) * static_cast<double>(t) / static_cast<double>(o.warmup_steps));
  }
  switch (o.decay) {
    case LrScheduleOptions::Decay::kConstant: return peak_;
    case LrScheduleOptions::Decay::kCosine: {
      if (t >= o.total_steps) return o.min_lr;
      const double progress =
          static_cast<double>(t - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
      return o.min_lr + (peak_ - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
    case LrScheduleOptions::Decay::kStep:
      return peak_ * std::pow(o.gamma, static_cast<double>(t / o.step_size));
  }
  return peak_;
}

std::string LrSchedule::describe() const {
  const LrScheduleOptions& o = options_;
  std::string out;
  if (o.scaling == LrScheduleOptions::Scaling::kNone) {
    out = fmt::format("lr: peak {:g} (no batch scaling)", peak_);
  } else {
    out = fmt::format("lr: base {:g} at batch {}, {} scaling x{:g} to peak {:g} at batch {}", o.base_lr, o.base_batch,
                      to_string(o.scaling), scale_factor(o), peak_, o.global_batch);
  }
  if (o.warmup_steps > 0)
    out += fmt::format("; warmup {} steps from {:g}", o.warmup_steps, peak_ * o.warmup_start_factor);
  switch (o.decay) {
    case LrScheduleOptions::Decay::kConstant: out += "; then constant"; break;
    case LrScheduleOptions::Decay::kCosine:
      out += fmt::format("; then cosine to {:g} at step {}", o.min_lr, o.total_steps);
      break;
    case LrScheduleOptions::Decay::kStep:
      out += fmt::format("; then x{:g} every {} steps", o.gamma, o.step_size);
      break;
  }
  return out;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  TORCH_CHECK(std::isfinite(lr) && lr >= 0, "set_learning_rate: rate must be finite and >= 0, got ", lr);
  // OptimizerOptions::set_lr is virtual: SGD/Adam/AdamW/... and our LarsOptions
  // and LambOptions override it; the base throws for options that do not.
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace paratrain::optim

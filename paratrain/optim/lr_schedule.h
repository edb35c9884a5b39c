// Learning-rate schedules for large-batch training: batch-size scaling of the
// base rate (linear, Goyal et al. arXiv 1706.02677; or square root), linear
// warmup, then constant / cosine / step decay. Pure and stateless: lr(t) is a
// function of the optimizer step t alone, so resuming a run needs no schedule
// state. Not here: applying the rate (set_learning_rate below does that for
// the caller), the optimizers themselves (lars.h, lamb.h).
//
//   LrScheduleOptions o; o.base_lr = 0.1; o.base_batch = 256; o.global_batch = 8192;
//   o.scaling = LrScheduleOptions::Scaling::kLinear; o.warmup_steps = 500;
//   o.decay = LrScheduleOptions::Decay::kCosine; o.total_steps = 10000;
//   LrSchedule schedule(o);          // validates (ConfigError naming lr.* keys)
//   for (int64_t t = 0; ...; ++t) { set_learning_rate(opt, schedule.lr(t)); ...; opt.step(); }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace torch::optim {
class Optimizer;
}

namespace paratrain::optim {

// The config keys the lead maps onto these fields are given in brackets; the
// errors of parse_*() and validate() name them.
struct LrScheduleOptions {
  enum class Scaling { kNone, kLinear, kSqrt };
  enum class Decay { kConstant, kCosine, kStep };

  // [lr.base_lr] The rate tuned at base_batch (or the rate, without scaling).
  double base_lr = 0.1;
  // [lr.base_batch] The global batch base_lr was tuned for; 0 = no scaling
  // (then `scaling` must be kNone).
  int64_t base_batch = 0;
  // [lr.global_batch] The global batch per optimizer step of this run (the
  // Trainer fills it from its batch sizes: per-rank batch * dp * accumulate).
  int64_t global_batch = 0;
  // [lr.scaling] peak = base_lr * k (kLinear) or base_lr * sqrt(k) (kSqrt),
  // k = global_batch / base_batch. Linear is what Goyal et al. use for SGD
  // up to k ~ 32 (8k images); beyond that, or for Adam-type optimizers, it
  // overshoots and sqrt (Krizhevsky arXiv 1404.5997, Hoffer et al.) or
  // LARS/LAMB are the usual choices.
  Scaling scaling = Scaling::kNone;
  // [lr.warmup_steps] Steps of linear warmup to the peak; 0 = none. Large
  // scaled rates diverge in the first steps without it (Goyal et al. sec. 2.2).
  int64_t warmup_steps = 0;
  // [lr.warmup_start_factor] Warmup starts at peak * factor, in [0, 1]:
  //   lr(t) = peak * (f + (1 - f) * t / warmup_steps)   for 0 <= t < warmup_steps,
  // reaching the peak at t = warmup_steps (the same shape as PyTorch's
  // LinearLR(start_factor = f, total_iters = warmup_steps)). With the default
  // f = 0, step 0 uses rate 0 (a step that only builds momentum / Adam
  // moments). Goyal et al.'s "gradual warmup" starts from the unscaled base_lr,
  // i.e. f = 1/k = base_batch / global_batch with linear scaling.
  double warmup_start_factor = 0.0;
  // [lr.decay] What follows warmup (t >= warmup_steps):
  //   kConstant: peak.
  //   kCosine:   min_lr + (peak - min_lr) * (1 + cos(pi * s / D)) / 2 with
  //              s = t - warmup_steps, D = total_steps - warmup_steps (SGDR,
  //              Loshchilov & Hutter arXiv 1608.03983, one cycle); min_lr for
  //              t >= total_steps.
  //   kStep:     peak * gamma^floor(t / step_size), t counted from step 0 (not
  //              from the end of warmup) like PyTorch's StepLR and Goyal et
  //              al.'s "divide by 10 at epochs 30, 60, 80".
  Decay decay = Decay::kConstant;
  // [lr.total_steps] Cosine only: the step count the cosine spans to its end.
  int64_t total_steps = 0;
  // [lr.min_lr] Cosine only: the floor, 0 <= min_lr <= peak.
  double min_lr = 0.0;
  // [lr.step_size] Step decay only: steps between decays (> 0).
  int64_t step_size = 0;
  // [lr.gamma] Step decay only: the factor per decay, in (0, 1].
  double gamma = 0.1;

  // Throws ConfigError naming the first offending key and what is allowed.
  void validate() const;
};

// "none" | "linear" | "sqrt"; ConfigError naming lr.scaling otherwise.
LrScheduleOptions::Scaling parse_lr_scaling(std::string_view text);
// "constant" | "cosine" | "step"; ConfigError naming lr.decay otherwise.
LrScheduleOptions::Decay parse_lr_decay(std::string_view text);
std::string_view to_string(LrScheduleOptions::Scaling scaling);
std::string_view to_string(LrScheduleOptions::Decay decay);

class LrSchedule {
 public:
  // Validates `options` (ConfigError).
  explicit LrSchedule(LrScheduleOptions options);

  // The rate for 0-based optimizer step t (t >= 0; TORCH_CHECK).
  double lr(int64_t t) const;
  // base_lr after batch-size scaling: the rate warmup ends at.
  double peak_lr() const { return peak_; }
  const LrScheduleOptions& options() const { return options_; }
  // One line for the start-up print, e.g. "lr: base 0.1 at batch 256, linear
  // scaling x32 to peak 3.2 at batch 8192; warmup 500 steps from 0; cosine to
  // 0 at step 10000".
  std::string describe() const;

 private:
  LrScheduleOptions options_;
  double peak_ = 0;
};

// Sets the rate of every param group of `optimizer` (SGD, Adam, AdamW, Lars,
// Lamb, and any optimizer whose options implement set_lr). Call it before
// each step with LrSchedule::lr(step).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace paratrain::optim

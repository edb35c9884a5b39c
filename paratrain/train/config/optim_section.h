// [optimizer], [lr] and [precision]: the optimizer, its learning-rate schedule and mixed precision.
// The sections of TrainConfig (config.h) that configure optim/ (LARS, LAMB, LrScheduleOptions, GradScalerOptions) and train/precision.h.
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in optim_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/optim/grad_scaler.h"

namespace paratrain::train {

/// `[optimizer]`: the optimizer and its hyper-parameters (optim/).
struct OptimizerConfig {
  std::string kind = "sgd";  ///< "sgd" | "adam" | "adamw" | "lars" | "lamb"
  double lr = 0.05;          ///< the base rate of the [lr] schedule
  double momentum = 0.9;     ///< SGD and LARS
  double weight_decay = 0.0;  ///< L2 penalty (decoupled for AdamW/LAMB)
  bool nesterov = false;     ///< SGD only; needs momentum > 0
  std::vector<double> betas{0.9, 0.999};  ///< Adam/AdamW/LAMB
  /// Adam/AdamW/LAMB: added to sqrt(v) (the LAMB paper uses 1e-6); LARS:
  /// added to the trust ratio's denominator.
  double eps = 1e-8;
  /// LARS (arXiv 1708.03888): eta in the trust ratio eta ||w|| / (||g|| + wd ||w||).
  double trust_coefficient = 0.001;
  /// LARS/LAMB: biases and norm weights (tensors whose full shape has <= 1
  /// dim) skip the trust ratio and weight decay, as Goyal et al. and BERT's
  /// LAMB recipe do; false adapts (and decays) every tensor.
  bool exclude_from_adaptation = true;
  /// 0 = off. Else gradients are scaled so their global L2 norm (over every
  /// parameter, across shards) is at most this, before each step.
  double clip_grad_norm = 0.0;

  bool operator==(const OptimizerConfig&) const = default;
};

/// The learning-rate schedule (optim/lr_schedule.h): optimizer.lr is the
/// base rate; these keys scale it with the global batch, warm it up and decay
/// it per optimizer step. The defaults keep optimizer.lr constant.
struct LrConfig {
  /// The global batch optimizer.lr was tuned for; 0 = none (lr.scaling must
  /// then be "none").
  int64_t base_batch = 0;
  /// "none" | "linear" | "sqrt": the peak rate is optimizer.lr * k or
  /// optimizer.lr * sqrt(k), k = global batch / base_batch (Goyal et al.,
  /// arXiv 1706.02677: linear for SGD; sqrt for Adam-type optimizers).
  std::string scaling = "none";
  /// Linear warmup to the peak over this many steps (0 = none); or over
  /// warmup_epochs epochs, rounded to whole steps (set one of the two).
  int64_t warmup_steps = 0;
  double warmup_epochs = 0.0;  ///< warmup length in epochs (instead of warmup_steps)
  /// Warmup starts at peak * factor, in [0, 1]. Goyal et al. start at the
  /// unscaled rate: factor = base_batch / global batch with linear scaling.
  double warmup_start_factor = 0.0;
  /// "constant" | "cosine" (to min_lr at the run's last step) | "step"
  /// (times gamma every step_size steps or step_epochs epochs).
  std::string decay = "constant";
  double min_lr = 0.0;       ///< cosine: the rate at the last step
  int64_t step_size = 0;     ///< step decay: steps between decays
  double step_epochs = 0.0;  ///< step decay: epochs between decays (instead of step_size)
  double gamma = 0.1;        ///< step decay: the factor per decay

  bool operator==(const LrConfig&) const = default;
};

/// Mixed precision (see docs/notes/precision.md). bf16 has fp32's exponent
/// range, so it trains without loss scaling; fp16 underflows small gradients
/// and needs loss_scale = "dynamic" (or a static number).
struct PrecisionConfig {
  /// "fp32", "bf16" (CPU autocast) or "fp16" (CUDA builds only). Autocast
  /// covers forward and loss; parameters, gradients and optimizer state stay
  /// fp32.
  std::string compute = "fp32";
  /// "dynamic", "none", or a number string ("1024": a static scale).
  std::string loss_scale = "none";
  /// The loss scaler's knobs (optim/grad_scaler.h): precision.init_scale,
  /// growth_factor, backoff_factor and growth_interval are its fields, with
  /// its defaults; its mode is set from loss_scale when the scaler is built.
  optim::GradScalerOptions scaler;
  /// DDP's gradient all-reduce on the wire: "fp32", or "bf16" / "fp16" (half
  /// the bytes, added in fp32: comm/low_precision_all_reduce.h).
  std::string comm_dtype = "fp32";

  bool operator==(const PrecisionConfig&) const = default;
};

}  // namespace paratrain::train

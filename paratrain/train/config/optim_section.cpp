// The schema rows and cross-key rules of [optimizer], [lr] and [precision] (optim_section.h).
#include "paratrain/train/config/optim_section.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {
namespace {

std::string lr_problem(const TrainConfig& c) {
  const LrConfig& l = c.lr;
  if (l.scaling != "none" && l.base_batch == 0)
    return fmt::format("lr.scaling = \"{}\" needs lr.base_batch > 0 (the global batch optimizer.lr was tuned "
                       "for); set it, or lr.scaling = \"none\"",
                       l.scaling);
  if (l.warmup_steps > 0 && l.warmup_epochs > 0)
    return fmt::format("lr.warmup_steps = {} and lr.warmup_epochs = {} are both set; set one of them to 0",
                       l.warmup_steps, l.warmup_epochs);
  if (l.decay == "step") {
    if ((l.step_size > 0) == (l.step_epochs > 0))
      return fmt::format("lr.decay = \"step\" needs exactly one of lr.step_size (steps) and lr.step_epochs "
                         "(epochs) > 0 (got {} and {})",
                         l.step_size, l.step_epochs);
  } else if (l.step_size > 0 || l.step_epochs > 0) {
    return fmt::format("lr.step_size / lr.step_epochs only apply to lr.decay = \"step\" (got \"{}\"): set "
                       "lr.decay = \"step\" or both to 0",
                       l.decay);
  }
  if (l.decay != "cosine" && l.min_lr > 0)
    return fmt::format("lr.min_lr = {} only applies to lr.decay = \"cosine\" (got \"{}\"): set lr.decay = "
                       "\"cosine\" or lr.min_lr = 0",
                       l.min_lr, l.decay);
  return "";
}

// The [lr] rules that involve several keys; the ones that need the global
// batch and step counts (lr.min_lr <= peak, cosine longer than warmup) are
// checked where the Trainer builds the schedule.
std::string layerwise_problem(const TrainConfig& c) {
  if (c.optimizer.kind == "lars" && c.optimizer.momentum >= 1)
    return fmt::format("optimizer.kind = \"lars\" needs optimizer.momentum < 1 (got {})", c.optimizer.momentum);
  return "";
}

}  // namespace

std::vector<FieldSpec> optimizer_fields() {
  using TC = TrainConfig;
  return {
      field("optimizer.kind", &TC::optimizer, &OptimizerConfig::kind, "\"sgd\", \"adam\", \"adamw\", \"lars\" or \"lamb\"", one_of({"sgd", "adam", "adamw", "lars", "lamb"})),
      field("optimizer.lr", &TC::optimizer, &OptimizerConfig::lr, "learning rate; the base rate that the [lr] schedule scales, warms up and decays", positive_float32()),
      field("optimizer.momentum", &TC::optimizer, &OptimizerConfig::momentum, "SGD and LARS momentum (0 = plain SGD; LARS needs < 1)", in_range_finite(0.0, 1.0)),
      field("optimizer.weight_decay", &TC::optimizer, &OptimizerConfig::weight_decay, "L2 penalty (decoupled for adamw)", non_negative_float32()),
      field("optimizer.nesterov", &TC::optimizer, &OptimizerConfig::nesterov, "SGD Nesterov momentum (needs momentum > 0)"),
      field("optimizer.betas", &TC::optimizer, &OptimizerConfig::betas, "Adam, AdamW and LAMB [beta1, beta2]", adam_betas()),
      field("optimizer.eps", &TC::optimizer, &OptimizerConfig::eps, "Adam/AdamW/LAMB denominator epsilon (LAMB paper: 1e-6); LARS: added to the trust ratio's denominator", positive_float32()),
      field("optimizer.trust_coefficient", &TC::optimizer, &OptimizerConfig::trust_coefficient, "LARS trust coefficient eta (paper: 0.001)", in_range_finite(0.0, 1e6)),
      field("optimizer.exclude_from_adaptation", &TC::optimizer, &OptimizerConfig::exclude_from_adaptation, "LARS/LAMB: biases and norm weights (<= 1-D) skip the trust ratio and weight decay"),
      field("optimizer.clip_grad_norm", &TC::optimizer, &OptimizerConfig::clip_grad_norm, "max global gradient L2 norm (0 = no clipping)", non_negative_float32()),
  };
}

std::vector<FieldSpec> lr_fields() {
  using TC = TrainConfig;
  return {
      field("lr.base_batch", &TC::lr, &LrConfig::base_batch, "global batch optimizer.lr was tuned for (0 = none; needs lr.scaling = \"none\")", in_range<int64_t>(0, kMaxCount)),
      field("lr.scaling", &TC::lr, &LrConfig::scaling, "\"none\", \"linear\" or \"sqrt\": peak = optimizer.lr x (global batch / lr.base_batch), or x its square root", one_of({"none", "linear", "sqrt"})),
      field("lr.warmup_steps", &TC::lr, &LrConfig::warmup_steps, "linear warmup to the peak over this many optimizer steps (0 = none)", in_range<int64_t>(0, kMaxCount)),
      field("lr.warmup_epochs", &TC::lr, &LrConfig::warmup_epochs, "warmup in epochs instead (rounded to whole steps; 0 = use warmup_steps)", in_range_finite(0.0, static_cast<double>(kMaxCount))),
      field("lr.warmup_start_factor", &TC::lr, &LrConfig::warmup_start_factor, "warmup starts at peak x this (Goyal et al.: lr.base_batch / global batch)", in_range_finite(0.0, 1.0)),
      field("lr.decay", &TC::lr, &LrConfig::decay, "after warmup: \"constant\", \"cosine\" (to lr.min_lr at the last step) or \"step\"", one_of({"constant", "cosine", "step"})),
      field("lr.min_lr", &TC::lr, &LrConfig::min_lr, "cosine: the rate at the last step", non_negative_float32()),
      field("lr.step_size", &TC::lr, &LrConfig::step_size, "step decay: multiply by lr.gamma every this many steps (or use lr.step_epochs)", in_range<int64_t>(0, kMaxCount)),
      field("lr.step_epochs", &TC::lr, &LrConfig::step_epochs, "step decay: period in epochs instead (rounded to whole steps)", in_range_finite(0.0, static_cast<double>(kMaxCount))),
      field("lr.gamma", &TC::lr, &LrConfig::gamma, "step decay: factor per period, in (0, 1]", Check<double>([](const double& v) { return v > 0 && v <= 1 ? "" : "must be a number in (0, 1]"; })),
  };
}

std::vector<FieldSpec> precision_fields() {
  using TC = TrainConfig;
  return {
      field("precision.compute", &TC::precision, &PrecisionConfig::compute, "\"fp32\", \"bf16\" (autocast; no loss scaling needed) or \"fp16\" (CUDA builds; needs loss_scale)", one_of({"fp32", "bf16", "fp16"})),
      field("precision.loss_scale", &TC::precision, &PrecisionConfig::loss_scale, "\"dynamic\", \"none\", or a number string for a static scale", loss_scale_form()),
      field("precision.init_scale", &TC::precision, &PrecisionConfig::scaler, &optim::GradScalerOptions::init_scale, "dynamic loss scaling: first scale", in_range_finite(1e-30, 1e30)),
      field("precision.growth_factor", &TC::precision, &PrecisionConfig::scaler, &optim::GradScalerOptions::growth_factor, "dynamic: scale x this after growth_interval good steps", in_range_finite(1.0 + 1e-9, 1e6, "> 1")),
      field("precision.backoff_factor", &TC::precision, &PrecisionConfig::scaler, &optim::GradScalerOptions::backoff_factor, "dynamic: scale x this on an inf/nan step", in_range_finite(1e-9, 1.0 - 1e-9, "in (0, 1)")),
      field("precision.growth_interval", &TC::precision, &PrecisionConfig::scaler, &optim::GradScalerOptions::growth_interval, "dynamic: good steps in a row before growing", in_range<int64_t>(1, kMaxCount)),
      field("precision.comm_dtype", &TC::precision, &PrecisionConfig::comm_dtype, "DDP and ZeRO-1/2 gradient collectives on the wire: \"fp32\", or \"bf16\" / \"fp16\" (half the bytes, summed in fp32)", one_of({"fp32", "bf16", "fp16"})),
  };
}

std::string optim_problem(const TrainConfig& c) {
  if (std::string problem = lr_problem(c); !problem.empty()) return problem;
  if (std::string problem = layerwise_problem(c); !problem.empty()) return problem;
  if (c.optimizer.nesterov && (c.optimizer.kind != "sgd" || c.optimizer.momentum <= 0))
    return fmt::format(
        "optimizer.nesterov = true needs optimizer.kind = \"sgd\" and optimizer.momentum > 0 "
        "(got kind \"{}\", momentum {}): set nesterov = false or use SGD with momentum",
        c.optimizer.kind, c.optimizer.momentum);
  if (c.precision.compute == "fp16" && !at::hasCUDA())
    return "precision.compute = \"fp16\" needs a CUDA build (LibTorch autocasts CPU ops to bf16 only); this "
           "build is CPU-only: use precision.compute = \"bf16\" (no loss scaling needed) or \"fp32\"";
  const bool zero_wire = c.zero.stage == 1 || c.zero.stage == 2;
  if (c.precision.comm_dtype != "fp32" &&
      ((c.zero.stage != 0 && !zero_wire) || c.ddp.mode != "bucketed" || c.parallel.pp != 1 || c.parallel.tp != 1 ||
       c.parallel.cp != 1))
    return fmt::format("precision.comm_dtype = \"{}\" compresses the bucketed DDP and ZeRO-1/2 gradient collectives "
                       "only (zero.stage = 0, 1 or 2, ddp.mode = \"bucketed\", parallel.pp = tp = cp = 1); got "
                       "zero.stage = {}, ddp.mode = \"{}\", pp = {}, tp = {}, cp = {}: set precision.comm_dtype = "
                       "\"fp32\" or change those keys",
                       c.precision.comm_dtype, c.zero.stage, c.ddp.mode, c.parallel.pp, c.parallel.tp, c.parallel.cp);
  return "";
}

}  // namespace paratrain::train::detail

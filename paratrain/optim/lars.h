// LARS, layer-wise adaptive rate scaling (You, Gitman & Ginsburg, arXiv
// 1708.03888, Algorithm 1), as a torch::optim::Optimizer: momentum SGD whose
// step for each tensor is scaled by a trust ratio eta * ||w|| / (||g|| + wd ||w||).
// Works on ZeRO shards through a NormReducer (layer_norms.h). Not here: the
// learning-rate schedule (lr_schedule.h), which tensors to exclude (the rule
// lives in layer_norms.h; lars_param_groups() applies it).
//
//   auto split = optim::split_for_adaptation(model->named_parameters());
//   optim::Lars opt(optim::lars_param_groups(split, optim::LarsOptions(0.1).weight_decay(5e-4)),
//                   optim::LarsOptions(0.1));
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <vector>

#include "paratrain/optim/layer_norms.h"

namespace paratrain::optim {

struct LarsOptions : public torch::optim::OptimizerCloneableOptions<LarsOptions> {
  LarsOptions(double lr = 0.1);  // NOLINT: implicit like torch's SGDOptions(lr)
  // The global rate gamma_t (from LrSchedule), multiplied by each tensor's
  // local rate.
  TORCH_ARG(double, lr);
  // m in v = m v + lr * local_lr * (g + wd w). The velocity v holds rates
  // already applied (the paper's form), so a rate change acts on new
  // gradients only, not on the accumulated velocity as in torch's SGD.
  TORCH_ARG(double, momentum) = 0.9;
  // beta: L2 decay folded into the gradient and into the ratio's denominator.
  TORCH_ARG(double, weight_decay) = 0.0;
  // eta: how far one step may move a tensor relative to its norm. The paper
  // uses 0.001; larger values follow the raw gradient more.
  TORCH_ARG(double, trust_coefficient) = 0.001;
  // Added to the ratio's denominator so a tiny gradient cannot blow it up.
  TORCH_ARG(double, eps) = 1e-8;
  // true: this group skips the trust ratio (local_lr = 1: plain momentum SGD
  // with the paper's velocity form). For biases and norm weights, whose small
  // norms give ratios that stall them; see excluded_by_default().
  TORCH_ARG(bool, exclude) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const LarsOptions& lhs, const LarsOptions& rhs);
  double get_lr() const override;
  void set_lr(double lr) override;
};

// LARS keeps exactly SGD's per-parameter state (momentum_buffer), so it uses
// torch::optim::SGDParamState: model-state accounting (core/model_state.h)
// recognises it unchanged, and torch::save/load round-trips it.
using LarsParamState = torch::optim::SGDParamState;

class Lars : public torch::optim::Optimizer {
 public:
  Lars(std::vector<torch::optim::OptimizerParamGroup> param_groups, LarsOptions defaults);
  Lars(std::vector<at::Tensor> params, LarsOptions defaults);

  // Per step, with g the gradient and w the param of each tensor:
  //   d = g + wd w
  //   local_lr = eta ||w|| / (||g|| + wd ||w|| + eps), or 1 when ||w|| or ||g||
  //              is 0 or the group is excluded
  //   v = m v + lr local_lr d;  w -= v
  // Params without a gradient are skipped (their norms still take part in
  // the reducer's collective, as zeros).
  at::Tensor step(LossClosure closure = nullptr) override;

  // Completes ||w|| and ||g|| across shards before the ratios (one call per
  // step, collective): sharded_norm_reducer() for ZeRO pieces. Unset: every
  // param is a whole tensor.
  void set_norm_reducer(NormReducer reducer) { reducer_ = std::move(reducer); }

  // torch::save / torch::load: per-parameter state and every group's options
  // (LibTorch 1.13's own optimizers restore only the state on load). The
  // norm reducer is not saved: set it again after building the optimizer.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  NormReducer reducer_;
};

// Two param groups: split.adapted with `options`, split.excluded with
// options.exclude(true) and, unless decay_excluded, weight_decay 0 (Goyal et
// al. and most LARS recipes do not decay biases and norm weights). Both groups
// are always present (possibly empty), so the group layout is the same on
// every rank and across checkpoints.
std::vector<torch::optim::OptimizerParamGroup> lars_param_groups(const ParamSplit& split, const LarsOptions& options,
                                                                 bool decay_excluded = false);

}  // namespace paratrain::optim

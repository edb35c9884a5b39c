// LAMB, layer-wise adaptive moments (You et al., arXiv 1904.00962, Algorithm
// 2), as a torch::optim::Optimizer: AdamW's update direction, scaled per
// tensor by the trust ratio phi(||w||) / ||r||. Works on ZeRO shards through a
// NormReducer (layer_norms.h). Not here: the learning-rate schedule
// (lr_schedule.h), which tensors to exclude (layer_norms.h).
//
//   auto split = optim::split_for_adaptation(model->named_parameters());
//   optim::Lamb opt(optim::lamb_param_groups(split, optim::LambOptions(1e-3).weight_decay(0.01)),
//                   optim::LambOptions(1e-3));
#pragma once

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <tuple>
#include <vector>

#include "paratrain/optim/layer_norms.h"

namespace paratrain::optim {

struct LambOptions : public torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3);  // NOLINT: implicit like torch's AdamWOptions(lr)
  TORCH_ARG(double, lr);
  // As Adam's (beta1, beta2): decay of the first and second moments.
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  // Added to sqrt(v_hat). The paper uses 1e-6; Adam's 1e-8 makes tensors
  // with tiny gradients take larger (and after the ratio, noisier) steps.
  TORCH_ARG(double, eps) = 1e-6;
  // lambda: decoupled decay added to the update direction, r += wd w, before
  // the trust ratio (so it is measured by ||r|| too).
  TORCH_ARG(double, weight_decay) = 0.0;
  // phi(z) = min(max(z, min_weight_norm), max_weight_norm): the paper's clamp
  // of ||w|| in the ratio's numerator; 0 = no bound on that side. The ratio is
  // 1 when ||w|| or ||r|| is 0 (fresh zero-initialised tensors move at lr).
  TORCH_ARG(double, min_weight_norm) = 0.0;
  TORCH_ARG(double, max_weight_norm) = 0.0;
  // true: this group skips the trust ratio (w -= lr r: AdamW with decoupled
  // decay). For biases and norm weights; see excluded_by_default().
  TORCH_ARG(bool, exclude) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const LambOptions& lhs, const LambOptions& rhs);
  double get_lr() const override;
  void set_lr(double lr) override;
};

// LAMB keeps AdamW's per-parameter state (step, exp_avg, exp_avg_sq; no
// max_exp_avg_sq), so it uses torch::optim::AdamWParamState: model-state
// accounting recognises it unchanged, checkpoint adapters read the same field
// names, and torch::save/load round-trips it.
using LambParamState = torch::optim::AdamWParamState;

class Lamb : public torch::optim::Optimizer {
 public:
  Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups, LambOptions defaults);
  Lamb(std::vector<at::Tensor> params, LambOptions defaults);

  // Per step t (1-based per param, kept in its state), with g the gradient:
  //   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
  //   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd w
  //   ratio = phi(||w||) / ||r||, or 1 when ||w|| or ||r|| is 0 or the group
  //           is excluded
  //   w -= lr ratio r
  // Params without a gradient are skipped (zeros in the reducer's collective).
  at::Tensor step(LossClosure closure = nullptr) override;

  // Completes ||w|| and ||r|| across shards before the ratios (one call per
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
// options.exclude(true) and, unless decay_excluded, weight_decay 0 (BERT's
// LAMB recipe decays neither biases nor LayerNorm weights). Both groups are
// always present (possibly empty).
std::vector<torch::optim::OptimizerParamGroup> lamb_param_groups(const ParamSplit& split, const LambOptions& options,
                                                                 bool decay_excluded = false);

}  // namespace paratrain::optim

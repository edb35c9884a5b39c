// ForeachAdam / ForeachAdamW: see foreach_adam.h.
#include "paratrain/optim/foreach_adam.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "paratrain/core/compat.h"

namespace paratrain::optim {
namespace {

// One group's step. kDecoupled: AdamW's weight decay (params shrink first);
// otherwise Adam's L2 term (added to the gradient). Per element exactly
// torch::optim::Adam(W)::step: p *= 1 - lr wd (AdamW); g += wd p (Adam);
// m = m b1 + (1 - b1) g; v = v b2 + (1 - b2) g g;
// p += -(lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
template <class State, class Options, bool kDecoupled, class Optimizer>
void step_group(Optimizer& optimizer, torch::optim::OptimizerParamGroup& group) {
  auto& options = static_cast<Options&>(group.options());
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<at::Scalar> sqrt_bc2, neg_step_size;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    const at::Tensor& grad = p.grad();
    TORCH_CHECK(!grad.is_sparse(), "Adam does not support sparse gradients");
    auto& states = optimizer.state();
    const auto key = compat::optimizer_state_key(p);
    auto it = states.find(key);
    if (it == states.end()) {
      auto state = std::make_unique<State>();
      state->step(0);
      state->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
      it = states.emplace(key, std::move(state)).first;
    }
    auto& state = static_cast<State&>(*it->second);
    state.step(state.step() + 1);
    const double bias_correction1 = 1 - std::pow(beta1, state.step());
    const double bias_correction2 = 1 - std::pow(beta2, state.step());
    params.push_back(p);
    grads.push_back(!kDecoupled && options.weight_decay() != 0 ? grad.add(p, options.weight_decay()) : grad);
    exp_avgs.push_back(state.exp_avg());
    exp_avg_sqs.push_back(state.exp_avg_sq());
    sqrt_bc2.emplace_back(std::sqrt(bias_correction2));
    neg_step_size.emplace_back(-(options.lr() / bias_correction1));
  }
  if (params.empty()) return;
  if (kDecoupled && options.weight_decay() != 0) at::_foreach_mul_(params, 1 - options.lr() * options.weight_decay());
  at::_foreach_mul_(exp_avgs, beta1);
  at::_foreach_add_(exp_avgs, grads, 1 - beta1);
  at::_foreach_mul_(exp_avg_sqs, beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
  std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denoms, sqrt_bc2);
  at::_foreach_add_(denoms, options.eps());
  at::_foreach_addcdiv_(params, exp_avgs, denoms, neg_step_size);
}

template <class Options>
bool any_amsgrad(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (const auto& group : groups)
    if (static_cast<const Options&>(group.options()).amsgrad()) return true;
  return false;
}

// The parent's step() around the groups: the closure under grad mode, the
// update without; amsgrad (no multi-tensor form here) falls back to
// `parent_step`.
template <class State, class Options, bool kDecoupled, class Optimizer, class ParentStep>
torch::Tensor step_all(Optimizer& optimizer, torch::optim::Optimizer::LossClosure closure, ParentStep parent_step) {
  if (any_amsgrad<Options>(optimizer.param_groups())) return parent_step(std::move(closure));
  at::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : optimizer.param_groups()) step_group<State, Options, kDecoupled>(optimizer, group);
  return loss;
}

}  // namespace

torch::Tensor ForeachAdam::step(LossClosure closure) {
  return step_all<torch::optim::AdamParamState, torch::optim::AdamOptions, false>(
      *this, std::move(closure), [this](LossClosure c) { return torch::optim::Adam::step(std::move(c)); });
}

torch::Tensor ForeachAdamW::step(LossClosure closure) {
  return step_all<torch::optim::AdamWParamState, torch::optim::AdamWOptions, true>(
      *this, std::move(closure), [this](LossClosure c) { return torch::optim::AdamW::step(std::move(c)); });
}

}  // namespace paratrain::optim

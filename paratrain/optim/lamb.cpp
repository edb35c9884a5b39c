// LAMB step, options serialization and param groups; see lamb.h.
#include "paratrain/optim/lamb.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "paratrain/core/compat.h"
#include "paratrain/optim/param_group_io.h"

namespace paratrain::optim {
namespace {

// The paper's phi: ||w|| clamped to the configured bounds (0 = unbounded).
double phi(double w_norm, const LambOptions& o) {
  if (o.min_weight_norm() > 0) w_norm = std::max(w_norm, o.min_weight_norm());
  if (o.max_weight_norm() > 0) w_norm = std::min(w_norm, o.max_weight_norm());
  return w_norm;
}

}  // namespace

LambOptions::LambOptions(double lr) : lr_(lr) {}

bool operator==(const LambOptions& lhs, const LambOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.min_weight_norm() == rhs.min_weight_norm() &&
         lhs.max_weight_norm() == rhs.max_weight_norm() && lhs.exclude() == rhs.exclude();
}

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(min_weight_norm);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_weight_norm);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exclude);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, min_weight_norm);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_weight_norm);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, exclude);
}

double LambOptions::get_lr() const { return lr(); }
void LambOptions::set_lr(double lr) { this->lr(lr); }

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups, LambOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LambOptions>(defaults)) {
  for (const auto& group : this->param_groups()) {
    const auto& o = static_cast<const LambOptions&>(group.options());
    const auto [b1, b2] = o.betas();
    TORCH_CHECK(o.lr() >= 0, "Lamb: invalid learning rate ", o.lr());
    TORCH_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "Lamb: betas must be in [0, 1), got (", b1, ", ", b2, ")");
    TORCH_CHECK(o.eps() >= 0, "Lamb: eps must be >= 0, got ", o.eps());
    TORCH_CHECK(o.weight_decay() >= 0, "Lamb: weight_decay must be >= 0, got ", o.weight_decay());
    TORCH_CHECK(o.min_weight_norm() >= 0 && o.max_weight_norm() >= 0 &&
                    (o.max_weight_norm() == 0 || o.max_weight_norm() >= o.min_weight_norm()),
                "Lamb: weight-norm bounds must be >= 0 with max >= min (0 = unbounded), got [", o.min_weight_norm(),
                ", ", o.max_weight_norm(), "]");
  }
}

Lamb::Lamb(std::vector<at::Tensor> params, LambOptions defaults)
    : Lamb({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor Lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Phase 1: moments and the update direction r of every tensor (kept until
  // phase 3: the ratio needs ||r|| over all shards first). Phase 2: ||w|| and
  // ||r|| completed by one reducer call. Phase 3: the updates.
  std::vector<at::Tensor> params, weights, updates;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const LambOptions&>(group.options());
    const auto [b1, b2] = o.betas();
    for (const at::Tensor& p : group.params()) {
      params.push_back(p);
      if (!p.grad().defined()) {
        weights.emplace_back();
        updates.emplace_back();
        continue;
      }
      const at::Tensor& g = p.grad();
      auto& slot = state()[compat::optimizer_state_key(p)];
      if (!slot) {
        auto s = std::make_unique<LambParamState>();
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<LambParamState&>(*slot);
      s.step(s.step() + 1);
      s.exp_avg().mul_(b1).add_(g, 1 - b1);
      s.exp_avg_sq().mul_(b2).addcmul_(g, g, 1 - b2);
      const double bias1 = 1 - std::pow(b1, static_cast<double>(s.step()));
      const double bias2 = 1 - std::pow(b2, static_cast<double>(s.step()));
      at::Tensor r = (s.exp_avg() / bias1).div_((s.exp_avg_sq() / bias2).sqrt_().add_(o.eps()));
      if (o.weight_decay() != 0) r.add_(p, o.weight_decay());
      weights.push_back(o.exclude() ? at::Tensor() : p);
      updates.push_back(r);
    }
  }
  // Excluded rows measure nothing (undefined weights); r is still needed below.
  std::vector<at::Tensor> measured = updates;
  for (std::size_t i = 0; i < measured.size(); ++i)
    if (!weights[i].defined()) measured[i] = at::Tensor();
  const auto norms = pairwise_norms(params, weights, measured, reducer_);

  std::size_t row = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const LambOptions&>(group.options());
    for (at::Tensor& p : group.params()) {
      const auto [w_norm, r_norm] = norms[row];
      const at::Tensor& r = updates[row++];
      if (!r.defined()) continue;
      double ratio = 1.0;
      if (!o.exclude() && w_norm > 0 && r_norm > 0) ratio = phi(w_norm, o) / r_norm;
      p.add_(r, -o.lr() * ratio);
    }
  }
  return loss;
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
  detail::load_param_group_options<LambOptions>(archive, *this);
}

std::vector<torch::optim::OptimizerParamGroup> lamb_param_groups(const ParamSplit& split, const LambOptions& options,
                                                                 bool decay_excluded) {
  LambOptions excluded = options;
  excluded.exclude(true);
  if (!decay_excluded) excluded.weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(split.adapted, std::make_unique<LambOptions>(options));
  groups.emplace_back(split.excluded, std::make_unique<LambOptions>(excluded));
  return groups;
}

}  // namespace paratrain::optim

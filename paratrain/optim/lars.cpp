// LARS step, options serialization and param groups; see lars.h.
#include "paratrain/optim/lars.h"

#include <torch/torch.h>

#include "paratrain/core/compat.h"
#include "paratrain/optim/param_group_io.h"

namespace paratrain::optim {

LarsOptions::LarsOptions(double lr) : lr_(lr) {}

bool operator==(const LarsOptions& lhs, const LarsOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.momentum() == rhs.momentum() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.trust_coefficient() == rhs.trust_coefficient() && lhs.eps() == rhs.eps() &&
         lhs.exclude() == rhs.exclude();
}

void LarsOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(trust_coefficient);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exclude);
}

void LarsOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, trust_coefficient);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, exclude);
}

double LarsOptions::get_lr() const { return lr(); }
void LarsOptions::set_lr(double lr) { this->lr(lr); }

Lars::Lars(std::vector<torch::optim::OptimizerParamGroup> param_groups, LarsOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LarsOptions>(defaults)) {
  for (const auto& group : this->param_groups()) {
    const auto& o = static_cast<const LarsOptions&>(group.options());
    TORCH_CHECK(o.lr() >= 0, "Lars: invalid learning rate ", o.lr());
    TORCH_CHECK(o.momentum() >= 0 && o.momentum() < 1, "Lars: momentum must be in [0, 1), got ", o.momentum());
    TORCH_CHECK(o.weight_decay() >= 0, "Lars: weight_decay must be >= 0, got ", o.weight_decay());
    TORCH_CHECK(o.trust_coefficient() > 0, "Lars: trust_coefficient must be > 0, got ", o.trust_coefficient());
    TORCH_CHECK(o.eps() >= 0, "Lars: eps must be >= 0, got ", o.eps());
  }
}

Lars::Lars(std::vector<at::Tensor> params, LarsOptions defaults)
    : Lars({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor Lars::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Phase 1: every tensor's ||w|| and ||g||, completed across shards by one
  // reducer call. Phase 2: the updates. Rows follow param-group order.
  std::vector<at::Tensor> params, weights, grads;
  for (const auto& group : param_groups()) {
    const bool adapted = !static_cast<const LarsOptions&>(group.options()).exclude();
    for (const at::Tensor& p : group.params()) {
      params.push_back(p);
      const bool measure = adapted && p.grad().defined();
      weights.push_back(measure ? p : at::Tensor());
      grads.push_back(measure ? p.grad() : at::Tensor());
    }
  }
  const auto norms = pairwise_norms(params, weights, grads, reducer_);

  std::size_t row = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const LarsOptions&>(group.options());
    for (at::Tensor& p : group.params()) {
      const auto [w_norm, g_norm] = norms[row++];
      if (!p.grad().defined()) continue;
      at::Tensor d = p.grad();
      if (o.weight_decay() != 0) d = d.add(p, o.weight_decay());
      double local_lr = 1.0;
      if (!o.exclude() && w_norm > 0 && g_norm > 0)
        local_lr = o.trust_coefficient() * w_norm / (g_norm + o.weight_decay() * w_norm + o.eps());

      auto& slot = state()[compat::optimizer_state_key(p)];
      if (!slot) {
        auto s = std::make_unique<LarsParamState>();
        s->momentum_buffer(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      at::Tensor& v = static_cast<LarsParamState&>(*slot).momentum_buffer();
      v.mul_(o.momentum()).add_(d, o.lr() * local_lr);
      p.sub_(v);
    }
  }
  return loss;
}

void Lars::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
}

void Lars::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LarsParamState, LarsOptions>(archive, *this);
  detail::load_param_group_options<LarsOptions>(archive, *this);
}

std::vector<torch::optim::OptimizerParamGroup> lars_param_groups(const ParamSplit& split, const LarsOptions& options,
                                                                 bool decay_excluded) {
  LarsOptions excluded = options;
  excluded.exclude(true);
  if (!decay_excluded) excluded.weight_decay(0.0);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(split.adapted, std::make_unique<LarsOptions>(options));
  groups.emplace_back(split.excluded, std::make_unique<LarsOptions>(excluded));
  return groups;
}

}  // namespace paratrain::optim

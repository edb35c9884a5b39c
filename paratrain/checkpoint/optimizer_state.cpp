// Per-optimizer state adapters for checkpoints: SGD and LARS (momentum_buffer),
// Adam/AdamW (step, exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad) and
// LAMB (step, exp_avg, exp_avg_sq).
// torch::optim keys state by TensorImpl address, which means nothing in
// another process; checkpoint.cpp re-keys it by parameter name.
#include "paratrain/checkpoint/optimizer_state.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/optim/lamb.h"
#include "paratrain/optim/lars.h"

namespace paratrain::checkpoint {
namespace {

std::string shape_str(at::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

using Fields = std::map<std::string, at::Tensor>;
using torch::optim::OptimizerParamState;

// Checks that `fields` has exactly `required` (+ any of `optional`) and that
// each tensor but "step" has the parameter's shape.
void check_fields(const Fields& fields, const std::vector<std::string>& required,
                  const std::vector<std::string>& optional, const at::Tensor& param, const std::string& prefix,
                  const std::string& file) {
  for (const auto& r : required)
    if (!fields.count(r))
      throw CheckpointError(fmt::format("checkpoint '{}' lacks optimizer state '{}{}'", file, prefix, r));
  for (const auto& [name, t] : fields) {
    const bool known = std::count(required.begin(), required.end(), name) ||
                       std::count(optional.begin(), optional.end(), name);
    if (!known)
      throw CheckpointError(fmt::format("checkpoint '{}' has unexpected optimizer state '{}{}'", file, prefix, name));
    if (name == "step") {
      if (t.numel() != 1 || t.scalar_type() != at::kLong)
        throw CheckpointError(fmt::format("checkpoint '{}': '{}step' must be one I64", file, prefix));
    } else if (t.sizes() != param.sizes()) {
      throw CheckpointError(fmt::format("checkpoint '{}': optimizer state '{}{}' has shape {}, the parameter has {}",
                                        file, prefix, name, shape_str(t.sizes()), shape_str(param.sizes())));
    }
  }
}

at::Tensor like_param(const at::Tensor& t, const at::Tensor& param) {
  return t.to(param.options()).clone();
}

const OptimizerStateIo kSgd{
    "sgd",
    [](const OptimizerParamState& s) {
      const auto& state = static_cast<const torch::optim::SGDParamState&>(s);
      std::vector<std::pair<std::string, at::Tensor>> out;
      if (state.momentum_buffer().defined()) out.emplace_back("momentum_buffer", state.momentum_buffer());
      return out;
    },
    [](const Fields& f, const at::Tensor& p, const torch::optim::OptimizerOptions&, const std::string& prefix,
       const std::string& file) -> std::unique_ptr<OptimizerParamState> {
      check_fields(f, {"momentum_buffer"}, {}, p, prefix, file);
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(like_param(f.at("momentum_buffer"), p));
      return s;
    },
    [](const torch::optim::Optimizer& o) {
      nlohmann::json groups = nlohmann::json::array();
      for (const auto& g : o.param_groups()) {
        const auto& x = static_cast<const torch::optim::SGDOptions&>(g.options());
        groups.push_back({{"lr", x.lr()}, {"momentum", x.momentum()}, {"dampening", x.dampening()},
                          {"weight_decay", x.weight_decay()}, {"nesterov", x.nesterov()}});
      }
      return groups;
    }};

// Adam and AdamW keep the same state in different classes.
template <class State, class Options>
OptimizerStateIo adam_like(std::string kind) {
  return OptimizerStateIo{
      std::move(kind),
      [](const OptimizerParamState& s) {
        const auto& state = static_cast<const State&>(s);
        std::vector<std::pair<std::string, at::Tensor>> out{
            {"step", at::scalar_tensor(state.step(), at::kLong)},
            {"exp_avg", state.exp_avg()},
            {"exp_avg_sq", state.exp_avg_sq()}};
        if (state.max_exp_avg_sq().defined()) out.emplace_back("max_exp_avg_sq", state.max_exp_avg_sq());
        return out;
      },
      [](const Fields& f, const at::Tensor& p, const torch::optim::OptimizerOptions& options,
         const std::string& prefix, const std::string& file) -> std::unique_ptr<OptimizerParamState> {
        const bool amsgrad = static_cast<const Options&>(options).amsgrad();
        check_fields(f, amsgrad ? std::vector<std::string>{"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
                                : std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"},
                     {"max_exp_avg_sq"}, p, prefix, file);
        auto s = std::make_unique<State>();
        s->step(f.at("step").template item<int64_t>());
        s->exp_avg(like_param(f.at("exp_avg"), p));
        s->exp_avg_sq(like_param(f.at("exp_avg_sq"), p));
        if (amsgrad) s->max_exp_avg_sq(like_param(f.at("max_exp_avg_sq"), p));
        return s;
      },
      [](const torch::optim::Optimizer& o) {
        nlohmann::json groups = nlohmann::json::array();
        for (const auto& g : o.param_groups()) {
          const auto& x = static_cast<const Options&>(g.options());
          groups.push_back({{"lr", x.lr()},
                            {"betas", {std::get<0>(x.betas()), std::get<1>(x.betas())}},
                            {"eps", x.eps()},
                            {"weight_decay", x.weight_decay()},
                            {"amsgrad", x.amsgrad()}});
        }
        return groups;
      },
      {"step"}};
}

// LARS keeps SGD's state (its velocity in momentum_buffer), LAMB AdamW's
// without max_exp_avg_sq (lars.h, lamb.h). Group options are rebuilt from
// the config, not the checkpoint; they are recorded for the reader.
const OptimizerStateIo kLars{
    "lars", kSgd.save,
    [](const Fields& f, const at::Tensor& p, const torch::optim::OptimizerOptions&, const std::string& prefix,
       const std::string& file) -> std::unique_ptr<OptimizerParamState> {
      check_fields(f, {"momentum_buffer"}, {}, p, prefix, file);
      auto s = std::make_unique<optim::LarsParamState>();
      s->momentum_buffer(like_param(f.at("momentum_buffer"), p));
      return s;
    },
    [](const torch::optim::Optimizer& o) {
      nlohmann::json groups = nlohmann::json::array();
      for (const auto& g : o.param_groups()) {
        const auto& x = static_cast<const optim::LarsOptions&>(g.options());
        groups.push_back({{"lr", x.lr()}, {"momentum", x.momentum()}, {"weight_decay", x.weight_decay()},
                          {"trust_coefficient", x.trust_coefficient()}, {"eps", x.eps()}, {"exclude", x.exclude()},
                          {"params", g.params().size()}});
      }
      return groups;
    }};

const OptimizerStateIo kLamb{
    "lamb",
    [](const OptimizerParamState& s) {
      const auto& state = static_cast<const optim::LambParamState&>(s);
      return std::vector<std::pair<std::string, at::Tensor>>{{"step", at::scalar_tensor(state.step(), at::kLong)},
                                                             {"exp_avg", state.exp_avg()},
                                                             {"exp_avg_sq", state.exp_avg_sq()}};
    },
    [](const Fields& f, const at::Tensor& p, const torch::optim::OptimizerOptions&, const std::string& prefix,
       const std::string& file) -> std::unique_ptr<OptimizerParamState> {
      check_fields(f, {"step", "exp_avg", "exp_avg_sq"}, {}, p, prefix, file);
      auto s = std::make_unique<optim::LambParamState>();
      s->step(f.at("step").item<int64_t>());
      s->exp_avg(like_param(f.at("exp_avg"), p));
      s->exp_avg_sq(like_param(f.at("exp_avg_sq"), p));
      return s;
    },
    [](const torch::optim::Optimizer& o) {
      nlohmann::json groups = nlohmann::json::array();
      for (const auto& g : o.param_groups()) {
        const auto& x = static_cast<const optim::LambOptions&>(g.options());
        groups.push_back({{"lr", x.lr()},
                          {"betas", {std::get<0>(x.betas()), std::get<1>(x.betas())}},
                          {"eps", x.eps()},
                          {"weight_decay", x.weight_decay()},
                          {"min_weight_norm", x.min_weight_norm()},
                          {"max_weight_norm", x.max_weight_norm()},
                          {"exclude", x.exclude()},
                          {"params", g.params().size()}});
      }
      return groups;
    },
    {"step"}};

}  // namespace

const OptimizerStateIo& optimizer_state_io(const torch::optim::Optimizer& optimizer, const std::string& file) {
  static const OptimizerStateIo adam = adam_like<torch::optim::AdamParamState, torch::optim::AdamOptions>("adam");
  static const OptimizerStateIo adamw =
      adam_like<torch::optim::AdamWParamState, torch::optim::AdamWOptions>("adamw");
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return kSgd;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return adam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return adamw;
  if (dynamic_cast<const optim::Lars*>(&optimizer)) return kLars;
  if (dynamic_cast<const optim::Lamb*>(&optimizer)) return kLamb;
  throw CheckpointError(fmt::format(
      "checkpoint '{}': this optimizer type has no checkpoint support (supported: SGD, Adam, AdamW, LARS, LAMB); "
      "add an OptimizerStateIo in paratrain/checkpoint/optimizer_state.cpp",
      file));
}

compat::OptimizerStateKey optimizer_state_key(const at::Tensor& param) {
  // What torch::optim uses to key Optimizer::state() (core/compat.h).
  return compat::optimizer_state_key(param);
}

}  // namespace paratrain::checkpoint

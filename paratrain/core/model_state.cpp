// Model-state accounting: see model_state.h.
#include "paratrain/core/model_state.h"

#include <torch/torch.h>

#include <typeinfo>
#include <unordered_set>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain {
namespace {

// Appends the tensors `fields` picks from one state if it is of type State.
template <typename State, typename Fields>
bool collect(const torch::optim::OptimizerParamState& state, std::vector<at::Tensor>& out, Fields fields) {
  const auto* s = dynamic_cast<const State*>(&state);
  if (s == nullptr) return false;
  for (const at::Tensor& t : fields(*s)) out.push_back(t);
  return true;
}

using Tensors = std::vector<at::Tensor>;

}  // namespace

int64_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (!seen.insert(t.storage().unsafeGetStorageImpl()).second) continue;
    bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  std::vector<at::Tensor> out;
  for (const auto& [key, state] : optimizer.state()) {
    const OptimizerParamState& s = *state;
    const bool known =
        collect<SGDParamState>(s, out, [](const SGDParamState& p) { return Tensors{p.momentum_buffer()}; }) ||
        collect<AdamParamState>(s, out, [](const AdamParamState& p) {
          return Tensors{p.exp_avg(), p.exp_avg_sq(), p.max_exp_avg_sq()};
        }) ||
        collect<AdamWParamState>(s, out, [](const AdamWParamState& p) {
          return Tensors{p.exp_avg(), p.exp_avg_sq(), p.max_exp_avg_sq()};
        }) ||
        collect<AdagradParamState>(s, out, [](const AdagradParamState& p) { return Tensors{p.sum()}; }) ||
        collect<RMSpropParamState>(s, out, [](const RMSpropParamState& p) {
          return Tensors{p.square_avg(), p.momentum_buffer(), p.grad_avg()};
        });
    if (!known) {
      throw Error(fmt::format("optimizer_state_tensors: unknown optimizer state type '{}'; add it to "
                              "paratrain/core/model_state.cpp",
                              typeid(s).name()));
    }
  }
  return out;
}

}  // namespace paratrain

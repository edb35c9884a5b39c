// Tied parameters across pipeline stages: see tied.h.
#include "paratrain/pipeline/tied.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::pipeline {

std::vector<TiedParameter> find_tied_parameters(const std::vector<models::Layer>& layers,
                                                const std::vector<int>& bounds, int stages) {
  struct Seen {
    std::string name;
    std::map<int, std::string> stages;  // stage -> its first name for the tensor
  };
  std::map<const c10::TensorImpl*, size_t> index;
  std::vector<Seen> seen;
  for (size_t mc = 0; mc + 1 < bounds.size(); ++mc) {
    const int stage = static_cast<int>(mc) % stages;
    for (int j = bounds[mc]; j < bounds[mc + 1]; ++j) {
      for (const auto& [prefix, module] : layers[j].modules) {
        for (const auto& p : module->named_parameters()) {
          const std::string name = prefix + "." + p.key();
          auto [it, added] = index.emplace(p.value().unsafeGetTensorImpl(), seen.size());
          if (added) seen.push_back({name, {}});
          seen[it->second].stages.emplace(stage, name);  // keeps the stage's first name
        }
      }
    }
  }
  std::vector<TiedParameter> out;
  for (const auto& s : seen) {
    if (s.stages.size() < 2) continue;
    TiedParameter t{s.name, {}, {}};
    for (const auto& [stage, name] : s.stages) {
      t.stages.push_back(stage);
      t.names.push_back(name);
    }
    out.push_back(std::move(t));
  }
  return out;
}

TiedGradients::TiedGradients(const topology::DeviceMesh& mesh, const std::vector<TiedParameter>& tied,
                             torch::nn::Module& local, std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  const auto params = local.named_parameters();
  const int stage = mesh.rank(topology::Axis::kPp);
  for (const auto& t : tied) {
    auto it = groups_.find(t.stages);
    if (it == groups_.end()) it = groups_.emplace(t.stages, topology::new_stage_group(mesh, t.stages)).first;
    if (!it->second) continue;  // not one of its stages
    const auto at = std::find(t.stages.begin(), t.stages.end(), stage);
    const std::string& name = t.names.empty() ? t.name : t.names[static_cast<size_t>(at - t.stages.begin())];
    const at::Tensor* p = params.find(name);
    if (p == nullptr) throw Error(fmt::format("pipeline: stage {} has no parameter {} to tie; this is a bug", stage, name));
    // The optimizer state's writer: the first stage that holds it under its
    // canonical name (the GPT's wte: stage 0; a second name: its holder).
    size_t writer = 0;
    while (!t.names.empty() && writer + 1 < t.names.size() && t.names[writer] != t.name) ++writer;
    entries_.push_back({name, t.names.empty() ? t.name : t.names.front(), t.name, *p, it->second.get(),
                        stage == t.stages.front(), stage == t.stages[writer]});
  }
}

void TiedGradients::broadcast_from_first() {
  torch::NoGradGuard no_grad;
  for (auto& e : entries_) {
    at::Tensor t = e.local.detach().contiguous();
    e.group->broadcast(t, 0)->wait(timeout_);  // group rank 0 is the first stage
    if (!t.is_same(e.local)) e.local.detach().copy_(t);
  }
}

void TiedGradients::all_reduce_gradients() {
  torch::NoGradGuard no_grad;
  for (auto& e : entries_) {
    // Frozen (freeze.modules names it on every stage alike): no gradient to
    // sum, and none made up.
    if (!e.local.requires_grad()) continue;
    if (!e.local.grad().defined()) e.local.mutable_grad() = torch::zeros_like(e.local);
    at::Tensor g = e.local.grad();
    TORCH_CHECK(g.is_contiguous(), "pipeline: the gradient of tied parameter ", e.name, " is not contiguous");
    e.group->all_reduce(g, comm::ReduceOp::kSum)->wait(timeout_);
  }
}

bool TiedGradients::is_copy(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return !e.first && e.name == e.first_name;
  }
  return false;
}

bool TiedGradients::counted_on_an_earlier_stage(const at::Tensor& t) const {
  for (const auto& e : entries_) {
    if (e.local.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return !e.first;
  }
  return false;
}

std::string TiedGradients::optimizer_name(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return e.canonical;
  }
  return name;
}

bool TiedGradients::writes_optimizer_state(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return e.writes_state;
  }
  return true;
}

bool TiedGradients::counted_on_an_earlier_stage(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return !e.first;
  }
  return false;
}

}  // namespace paratrain::pipeline

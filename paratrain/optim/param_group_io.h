// Restores param-group options (lr, momentum, exclude, ...) when an optimizer
// of ours is loaded with torch::load. LibTorch 1.13's optimizer serialization
// writes every group's options but its load restores only the per-parameter
// state; PyTorch's load_state_dict restores both, and a resumed LARS/LAMB run
// needs its exclusion flags and trust coefficients back. Header-only: used by
// lars.cpp and lamb.cpp, not a public entry.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace paratrain::optim::detail {

// Call after torch::optim::serialize<State, Options>(archive, optimizer) loaded
// the state (which already checked the group count and sizes).
template <typename Options>
void load_param_group_options(torch::serialize::InputArchive& archive, torch::optim::Optimizer& optimizer) {
  torch::serialize::InputArchive groups_archive;
  archive.read("param_groups", groups_archive);
  std::vector<std::pair<std::vector<std::string>, std::unique_ptr<torch::optim::OptimizerOptions>>> saved;
  torch::optim::detail::serialize<Options>(groups_archive, saved);
  TORCH_CHECK(saved.size() == optimizer.param_groups().size(), "loaded optimizer has ", saved.size(),
              " param groups, this one has ", optimizer.param_groups().size());
  for (std::size_t i = 0; i < saved.size(); ++i) optimizer.param_groups()[i].set_options(std::move(saved[i].second));
}

}  // namespace paratrain::optim::detail

// Which parameters form which FSDP unit: a pure function of the module tree
// and the options (no tensors are touched), so every rank plans the same
// units. Not here: the units' memory (flat_unit.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace paratrain::fsdp {

/// The default unit threshold, in parameter elements: of UnitPlanOptions,
/// FsdpOptions and the zero.unit_min_params config key.
inline constexpr int64_t kDefaultUnitMinParams = 50000;

struct UnitPlanOptions {
  // Threshold mode: walk the root's children in registration order and close
  // a unit once it holds >= min_params elements; a child that is a
  // container (ModuleList, Sequential) counts as its children ("blocks.0",
  // "blocks.1", ...). Small values: more units, less memory gathered at
  // once, more (smaller) collectives. <= 0: every child with parameters is
  // its own unit.
  int64_t min_params = kDefaultUnitMinParams;
  // Explicit mode (when not empty): each named child of the root is its own
  // unit; every other parameter goes to one root unit. Names must exist.
  std::vector<std::string> modules;
};

struct PlannedUnit {
  std::string name;  // "fc0", "conv0+conv1", "(root)"
  std::vector<std::pair<std::string, at::Tensor>> params;  // names as in named_parameters()
};

// Units in order: the root unit first (when it has parameters), then the
// children's units in registration order. Every parameter is in exactly one
// unit (a parameter shared by two children goes to the first).
std::vector<PlannedUnit> plan_units(torch::nn::Module& root, const UnitPlanOptions& options);

// "fc0, fc1" -> {"fc0", "fc1"} (spaces trimmed, empty entries dropped): the
// form of the zero.unit_modules config key.
std::vector<std::string> split_module_list(const std::string& comma_separated);

}  // namespace paratrain::fsdp

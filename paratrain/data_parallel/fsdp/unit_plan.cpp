// plan_units: grouping a module's children into FSDP units. See unit_plan.h.
#include "paratrain/data_parallel/fsdp/unit_plan.h"

#include <torch/torch.h>

#include <algorithm>
#include <unordered_set>

namespace paratrain::fsdp {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// Trainable parameters of `module` not yet assigned, named with `prefix`.
// Frozen ones belong to no unit (fsdp.h).
Named take_new(torch::nn::Module& module, const std::string& prefix, bool recurse,
               std::unordered_set<const void*>& seen) {
  Named out;
  for (const auto& item : module.named_parameters(recurse)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    if (!item.value().requires_grad()) continue;
    out.emplace_back(prefix + item.key(), item.value());
  }
  return out;
}

// The modules the size rule groups: the root's children, with a container
// (ModuleList, Sequential: no parameters of its own) replaced by its
// children, so a transformer's blocks are units of their own and not one
// unit holding the whole stack.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> size_candidates(torch::nn::Module& root) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& child : root.named_children()) {
    torch::nn::Module* m = child.value().get();
    const bool container = (dynamic_cast<torch::nn::ModuleListImpl*>(m) != nullptr ||
                            dynamic_cast<torch::nn::SequentialImpl*>(m) != nullptr) &&
                           m->named_parameters(/*recurse=*/false).is_empty();
    if (!container) {
      out.emplace_back(child.key(), child.value());
      continue;
    }
    for (const auto& inner : m->named_children()) out.emplace_back(child.key() + "." + inner.key(), inner.value());
  }
  return out;
}

int64_t numel_of(const Named& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.second.numel();
  return n;
}

}  // namespace

std::vector<PlannedUnit> plan_units(torch::nn::Module& root, const UnitPlanOptions& options) {
  std::unordered_set<const void*> seen;
  std::vector<PlannedUnit> units;
  PlannedUnit root_unit{"(root)", take_new(root, "", /*recurse=*/false, seen)};
  const auto children = root.named_children();

  if (!options.modules.empty()) {
    for (const auto& name : options.modules) {
      TORCH_CHECK(children.contains(name), "FSDP unit_modules names '", name,
                  "', which is not a child of the model; children are: ",
                  c10::Join(", ", children.keys()));
    }
    for (const auto& child : children) {
      const bool own = std::find(options.modules.begin(), options.modules.end(), child.key()) !=
                       options.modules.end();
      Named params = take_new(*child.value(), child.key() + ".", /*recurse=*/true, seen);
      if (params.empty()) continue;
      if (own) {
        units.push_back({child.key(), std::move(params)});
      } else {
        for (auto& p : params) root_unit.params.push_back(std::move(p));
      }
    }
  } else {
    PlannedUnit open;
    for (const auto& [name, module] : size_candidates(root)) {
      Named params = take_new(*module, name + ".", /*recurse=*/true, seen);
      if (params.empty()) continue;
      open.name += (open.name.empty() ? "" : "+") + name;
      for (auto& p : params) open.params.push_back(std::move(p));
      if (numel_of(open.params) >= options.min_params) units.push_back(std::exchange(open, {}));
    }
    if (!open.params.empty()) units.push_back(std::move(open));
  }
  if (!root_unit.params.empty()) units.insert(units.begin(), std::move(root_unit));
  return units;
}

std::vector<std::string> split_module_list(const std::string& comma_separated) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= comma_separated.size()) {
    std::size_t end = comma_separated.find(',', start);
    if (end == std::string::npos) end = comma_separated.size();
    std::string item = comma_separated.substr(start, end - start);
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    start = end + 1;
  }
  return out;
}

}  // namespace paratrain::fsdp

// freeze_modules: static layer freezing (freezing.h).
#include "paratrain/train/freeze/freezing.h"

#include <torch/nn/module.h>

#include <set>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train {

// Note [What freezing saves]
// A frozen parameter has requires_grad = false before any strategy sees the
// model, so each one leaves it out by the rule it already had for
// parameters that need no gradient: DDP's reducer and ZeRO-1/2 plan buckets
// and shards over trainable parameters only; FSDP keeps frozen parameters
// out of its units, whole on every rank (they are never gathered, reduced or
// stepped); parameter servers hold no key range for them, so workers neither
// push nor pull them; a pipeline chunk whose parameters and predecessors are
// all frozen runs its forward without autograd history and no backward (the
// executor's frozen_chunks), and has no replica wrapper (its buffers are
// broadcast as a wrapper would). The optimizer is built over what the strategy
// hands it, so frozen parameters get no state. Autograd itself saves the
// rest: a frozen prefix of the model sees inputs that need no gradient, so
// its forward records no graph and keeps no activations for backward. Every
// rank holds the frozen values (the same seed draws them; replicas are
// broadcast), and checkpoints write them once, as replicated slots.

bool under_module(const std::string& name, const std::string& module) {
  return name.size() >= module.size() && name.compare(0, module.size(), module) == 0 &&
         (name.size() == module.size() || name[module.size()] == '.');
}

FrozenSet freeze_modules(torch::nn::Module& model, const std::vector<std::string>& modules) {
  FrozenSet out;
  out.modules = modules;
  const auto params = model.named_parameters(/*recurse=*/true);
  for (const std::string& module : modules) {
    bool found = false;
    for (const auto& item : params) found = found || under_module(item.key(), module);
    if (found) continue;
    std::vector<std::string> children;
    for (const auto& child : model.named_children()) children.push_back(child.key());
    throw ConfigError(fmt::format(
        "freeze.modules names \"{}\", which holds no parameter of the model {}; name modules as "
        "named_parameters() does, e.g. a top-level module ({}) or a dotted path below one (\"blocks.0\")",
        module, model.name(), children.empty() ? std::string("the model has none") : fmt::format("{}", fmt::join(children, ", "))));
  }
  for (const auto& item : params) {
    bool frozen = false;
    for (const std::string& module : modules) frozen = frozen || under_module(item.key(), module);
    if (!frozen) continue;
    item.value().set_requires_grad(false);
    out.parameters.push_back(item.key());
  }
  // Counted per tensor: a tied weight (two names, one tensor) once.
  std::set<const void*> seen;
  for (const auto& item : params) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.total_numel += item.value().numel();
    if (!item.value().requires_grad()) out.frozen_numel += item.value().numel();
  }
  bool any_trainable = false;
  for (const auto& item : params) any_trainable = any_trainable || item.value().requires_grad();
  if (!modules.empty() && !any_trainable) {
    throw ConfigError(fmt::format("freeze.modules = [{}] freezes every parameter of the model: nothing would "
                                  "train. Leave at least one module out of freeze.modules",
                                  fmt::join(modules, ", ")));
  }
  return out;
}

}  // namespace paratrain::train

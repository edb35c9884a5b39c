// Layer freezing (docs/freezing.md): which parameters of a model train no
// more. Freezing is requires_grad(false) on the parameters under a module
// name, set on the freshly drawn model before a strategy wraps it: every
// strategy then plans its buckets, shards, units, key ranges and pipeline
// backward without them (Note [What freezing saves]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace paratrain::train {

/// What freeze_modules() froze.
struct FrozenSet {
  std::vector<std::string> modules;  ///< the names asked for, in the order given
  std::vector<std::string> parameters;  ///< every frozen parameter, by name
  int64_t frozen_numel = 0;  ///< elements of the frozen parameters (a tied tensor once)
  int64_t total_numel = 0;   ///< elements of every parameter (a tied tensor once)

  /// frozen_numel / total_numel (0 for a model without parameters).
  double fraction() const {
    return total_numel > 0 ? static_cast<double>(frozen_numel) / static_cast<double>(total_numel) : 0.0;
  }
};

/// Whether parameter `name` ("blocks.0.attn.qkv.weight") lies under module
/// `module` ("blocks.0"): equal, or `module` followed by a dot.
bool under_module(const std::string& name, const std::string& module);

/// Sets requires_grad(false) on every parameter of `model` under one of
/// `modules` (prefixes of named_parameters() names). ConfigError when a name
/// matches no parameter (it lists the model's top-level modules) or when
/// nothing would be left to train.
FrozenSet freeze_modules(torch::nn::Module& model, const std::vector<std::string>& modules);

}  // namespace paratrain::train

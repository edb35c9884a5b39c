// [freeze]: layer freezing, static and adaptive (docs/freezing.md). The
// section of TrainConfig (config.h) that train/freeze/ reads. Each key's type,
// doc line and range check, and the rules between keys, are beside it in
// freeze_section.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// `[freeze]`: parameters that train no more. A frozen parameter gets no
/// gradient, no gradient communication and no optimizer step; a frozen prefix
/// of the model runs its forward without autograd history.
struct FreezeConfig {
  /// Static freezing: modules (prefixes of named_parameters() names, e.g.
  /// "fc0", "blocks.0") frozen from the first step.
  std::vector<std::string> modules;
  /// Adaptive freezing (AutoFreeze's criterion): every check_every_steps,
  /// freeze the longest prefix of layers, in forward order, whose gradient
  /// norm changed by less than `threshold` (relative) since the last check.
  bool adaptive = false;
  int64_t check_every_steps = 50;  ///< steps between two checks
  double threshold = 0.05;         ///< relative change of a layer's gradient norm below which it has converged
  double max_fraction = 0.5;       ///< never freeze more than this share of the parameters

  bool operator==(const FreezeConfig&) const = default;
};

}  // namespace paratrain::train

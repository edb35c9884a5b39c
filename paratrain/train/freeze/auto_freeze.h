// AutoFreeze: when a prefix of layers has converged enough to freeze
// (adaptive freezing, freeze.adaptive; docs/freezing.md). The criterion
// alone, on numbers every rank holds alike: the gradient norm of each layer
// over the last check interval. The training loop's part that measures and
// re-plans is train/loop/adaptive_freezing.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// A layer as adaptive freezing sees it: one of the model's layers in
/// forward order (models::Model::layers(), or a top-level module).
struct FreezeLayer {
  std::string name;                  ///< "fc0", "blocks.3"
  std::vector<std::string> modules;  ///< its module names, as freeze.modules lists them
  int64_t numel = 0;                 ///< its parameters' elements (a tensor shared with an earlier layer not counted)
  bool frozen = false;               ///< frozen already (freeze.modules, or an earlier decision)
};

/// Note [The AutoFreeze criterion]
/// AutoFreeze (Liu et al., arXiv 2102.01386) freezes a layer once its
/// gradient norm stops changing: the layers of a network converge front to
/// back, and a layer whose gradient norm has levelled off contributes little
/// more. Here, at every check (freeze.check_every_steps), each layer's
/// gradient norm over the interval just ended is
///   G_l = sqrt(sum over the interval's steps of ||grad_l||^2),
/// summed over all ranks' shards (each element counted once) and unscaled
/// by the loss scale, so every rank holds the same G. Its relative change
/// since the previous check is
///   r_l = |G_l - G_l(previous)| / G_l(previous).
/// The frozen prefix grows to the longest run of layers, in forward order
/// from the first, that are frozen already or have r_l < freeze.threshold,
/// cut back so that the frozen share of parameters stays at or below
/// freeze.max_fraction. Only a prefix: freezing a layer whose successors
/// still train would still cost its backward (their gradients pass through
/// it), so it saves little; a prefix also runs its forward without autograd
/// history. The first check only records G; a decision needs two.
class AutoFreeze {
 public:
  AutoFreeze(std::vector<FreezeLayer> layers, double threshold, double max_fraction);

  const std::vector<FreezeLayer>& layers() const { return layers_; }
  /// The relative changes r_l of the last check (empty before the second).
  const std::vector<double>& last_changes() const { return changes_; }

  /// One check with the interval's norms G_l (one per layer; frozen layers'
  /// are ignored). Returns the layers newly frozen (indices, in order; empty
  /// when none), and marks them frozen.
  std::vector<int> check(const std::vector<double>& norms);

 private:
  std::vector<FreezeLayer> layers_;
  double threshold_;
  double max_fraction_;
  std::vector<double> previous_;
  std::vector<double> changes_;
};

}  // namespace paratrain::train

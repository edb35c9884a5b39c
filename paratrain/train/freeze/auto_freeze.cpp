// AutoFreeze's criterion (auto_freeze.h).
#include "paratrain/train/freeze/auto_freeze.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace paratrain::train {

AutoFreeze::AutoFreeze(std::vector<FreezeLayer> layers, double threshold, double max_fraction)
    : layers_(std::move(layers)), threshold_(threshold), max_fraction_(max_fraction) {}

std::vector<int> AutoFreeze::check(const std::vector<double>& norms) {
  if (norms.size() != layers_.size())
    throw std::invalid_argument("AutoFreeze::check: one gradient norm per layer expected");
  std::vector<int> out;
  const bool first = previous_.empty();
  changes_.assign(layers_.size(), std::numeric_limits<double>::infinity());
  if (!first) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].frozen || !(previous_[l] > 0) || !std::isfinite(norms[l])) continue;
      changes_[l] = std::abs(norms[l] - previous_[l]) / previous_[l];
    }
  }
  previous_ = norms;
  if (first) {
    changes_.clear();
    return out;
  }
  int64_t total = 0, frozen = 0;
  for (const auto& layer : layers_) {
    total += layer.numel;
    if (layer.frozen) frozen += layer.numel;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l].frozen) continue;
    if (!(changes_[l] < threshold_)) break;  // the prefix ends at the first layer still changing
    if (static_cast<double>(frozen + layers_[l].numel) > max_fraction_ * static_cast<double>(total)) break;
    // Never the last layer that trains: something must remain.
    bool later_trains = false;
    for (size_t k = l + 1; k < layers_.size(); ++k) later_trains = later_trains || !layers_[k].frozen;
    if (!later_trains) break;
    layers_[l].frozen = true;
    frozen += layers_[l].numel;
    out.push_back(static_cast<int>(l));
  }
  return out;
}

}  // namespace paratrain::train

// Intervals: see intervals.h.
#include "paratrain/profile/intervals.h"

#include <algorithm>

namespace paratrain::profile {

Intervals::Intervals(std::vector<std::pair<int64_t, int64_t>> parts) {
  for (const auto& p : parts)
    if (p.first < p.second) parts_.push_back(p);
  normalize();
}

void Intervals::add(int64_t begin, int64_t end) {
  if (end <= begin) return;
  parts_.emplace_back(begin, end);
  normalize();
}

void Intervals::normalize() {
  std::sort(parts_.begin(), parts_.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& p : parts_) {
    if (!merged.empty() && p.first <= merged.back().second) merged.back().second = std::max(merged.back().second, p.second);
    else merged.push_back(p);
  }
  parts_ = std::move(merged);
}

Intervals Intervals::unite(const Intervals& other) const {
  Intervals out = *this;
  out.parts_.insert(out.parts_.end(), other.parts_.begin(), other.parts_.end());
  out.normalize();
  return out;
}

Intervals Intervals::intersect(const Intervals& other) const {
  Intervals out;
  size_t i = 0, j = 0;
  while (i < parts_.size() && j < other.parts_.size()) {
    const int64_t begin = std::max(parts_[i].first, other.parts_[j].first);
    const int64_t end = std::min(parts_[i].second, other.parts_[j].second);
    if (begin < end) out.parts_.emplace_back(begin, end);
    if (parts_[i].second < other.parts_[j].second) ++i;
    else ++j;
  }
  return out;
}

Intervals Intervals::minus(const Intervals& other) const {
  Intervals out;
  size_t j = 0;
  for (auto [begin, end] : parts_) {
    while (j < other.parts_.size() && other.parts_[j].second <= begin) ++j;
    size_t k = j;
    while (begin < end && k < other.parts_.size() && other.parts_[k].first < end) {
      if (other.parts_[k].first > begin) out.parts_.emplace_back(begin, other.parts_[k].first);
      begin = std::max(begin, other.parts_[k].second);
      ++k;
    }
    if (begin < end) out.parts_.emplace_back(begin, end);
  }
  return out;
}

Intervals Intervals::clip(int64_t begin, int64_t end) const {
  Intervals window;
  window.add(begin, end);
  return intersect(window);
}

int64_t Intervals::length() const {
  int64_t total = 0;
  for (const auto& p : parts_) total += p.second - p.first;
  return total;
}

}  // namespace paratrain::profile

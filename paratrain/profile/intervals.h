// Sets of time intervals [begin, end) as sorted, disjoint lists: what the
// profile summary adds up (Note [Where a step's time went] in summary.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace paratrain::profile {

/// A set of microsecond intervals, kept sorted and disjoint.
class Intervals {
 public:
  Intervals() = default;
  /// The union of `parts` (any order, may overlap; empty ones dropped).
  explicit Intervals(std::vector<std::pair<int64_t, int64_t>> parts);
  /// Adds [begin, end) (nothing when end <= begin).
  void add(int64_t begin, int64_t end);
  /// The union, intersection and difference with `other`.
  Intervals unite(const Intervals& other) const;
  Intervals intersect(const Intervals& other) const;
  Intervals minus(const Intervals& other) const;
  /// Only what lies inside [begin, end).
  Intervals clip(int64_t begin, int64_t end) const;
  /// Total length in microseconds.
  int64_t length() const;
  const std::vector<std::pair<int64_t, int64_t>>& parts() const { return parts_; }  ///< sorted, disjoint

 private:
  void normalize();
  std::vector<std::pair<int64_t, int64_t>> parts_;
};

}  // namespace paratrain::profile

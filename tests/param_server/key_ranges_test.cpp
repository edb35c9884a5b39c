// Key-range partitioning: a worked example, and properties over random
// shapes, element sizes and server counts: every element is owned by exactly
// one server, ranges come in key order, and servers' bytes differ by at most
// one element's.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <stdexcept>

#include "paratrain/param_server/key_ranges.h"

namespace paratrain::param_server {
namespace {

// 10 + 2 + 4 = 16 float elements over 2 servers: 8 each, so the first
// tensor is split and server 1 gets its tail and both small tensors.
TEST(KeyRanges, SplitsALargeTensorAcrossServers) {
  const auto plan = plan_key_ranges({10, 2, 4}, {4, 4, 4}, 2);
  const std::vector<KeyRange> expected{{0, 0, 8, 0}, {0, 8, 10, 1}, {1, 0, 2, 1}, {2, 0, 4, 1}};
  EXPECT_EQ(plan.ranges, expected);
  EXPECT_EQ(plan.server_numel, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(plan.ranges_of(1).size(), 3u);
}

TEST(KeyRanges, MoreServersThanElementsLeavesSomeEmpty) {
  const auto plan = plan_key_ranges({2}, {4}, 4);
  EXPECT_EQ(plan.server_numel, (std::vector<int64_t>{1, 0, 1, 0}));
}

TEST(KeyRanges, RejectsBadArguments) {
  EXPECT_THROW(plan_key_ranges({1}, {4}, 0), std::invalid_argument);
  EXPECT_THROW(plan_key_ranges({-1}, {4}, 1), std::invalid_argument);
  EXPECT_THROW(plan_key_ranges({1}, {0}, 1), std::invalid_argument);
  EXPECT_THROW(plan_key_ranges({1, 2}, {4}, 1), std::invalid_argument);
}

RC_GTEST_PROP(KeyRanges, EveryElementHasExactlyOneOwnerAndLoadsAreBalanced, ()) {
  const int n = *rc::gen::inRange(0, 10);
  std::vector<int64_t> numel, element_bytes;
  int64_t total_bytes = 0, widest = 1;
  for (int i = 0; i < n; ++i) {
    numel.push_back(*rc::gen::inRange<int64_t>(0, 300));
    element_bytes.push_back(*rc::gen::element<int64_t>(1, 2, 4, 8));
    total_bytes += numel.back() * element_bytes.back();
    widest = std::max(widest, element_bytes.back());
  }
  const int servers = *rc::gen::inRange(1, 9);
  const auto plan = plan_key_ranges(numel, element_bytes, servers);

  // Coverage: walking the ranges in order visits every element of every
  // tensor once, in key order, with no empty range.
  std::vector<std::vector<int>> owners(n);
  for (int i = 0; i < n; ++i) owners[i].assign(numel[i], 0);
  int last_tensor = -1;
  int64_t last_end = 0;
  int last_server = 0;
  for (const auto& r : plan.ranges) {
    RC_ASSERT(r.numel() > 0);
    RC_ASSERT(r.server >= 0 && r.server < servers);
    RC_ASSERT(r.server >= last_server);  // key order = server order
    if (r.tensor == last_tensor) {
      RC_ASSERT(r.begin == last_end);
    } else {
      RC_ASSERT(r.tensor > last_tensor);
      RC_ASSERT(r.begin == 0);
      if (last_tensor >= 0) RC_ASSERT(last_end == numel[last_tensor]);
    }
    for (int64_t e = r.begin; e < r.end; ++e) ++owners[r.tensor][e];
    last_tensor = r.tensor;
    last_end = r.end;
    last_server = r.server;
  }
  for (int i = 0; i < n; ++i)
    for (int count : owners[i]) RC_ASSERT(count == 1);

  // Balance: each server within one element of its share of the bytes.
  int64_t summed = 0;
  for (int s = 0; s < servers; ++s) {
    summed += plan.server_bytes[s];
    const double share = static_cast<double>(total_bytes) / servers;
    RC_ASSERT(std::abs(plan.server_bytes[s] - share) <= static_cast<double>(widest) + 1);
  }
  RC_ASSERT(summed == total_bytes);
  // Deterministic: the same input gives the same plan.
  RC_ASSERT(plan_key_ranges(numel, element_bytes, servers).ranges == plan.ranges);
}

}  // namespace
}  // namespace paratrain::param_server

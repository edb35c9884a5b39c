// ShardLayout: a worked example and properties over random shapes and world
// sizes (numel not divisible by world included): the pieces of all ranks tile
// every parameter exactly once, and cutting flat buffers into rank slices and
// gathering them back through the pieces returns the original values exactly.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <numeric>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/zero/shard_layout.h"

namespace paratrain::zero {
namespace {

// Two parameters of 3 and 4 elements in one 7-element group over 2 ranks:
// padded to 8, rank 0 owns [0, 4) = a[0..3) + b[0], rank 1 owns [4, 8) =
// b[1..4) + one padding element.
TEST(ShardLayout, SplitsAParameterAcrossTheShardBoundary) {
  const ShardLayout layout({{{{0, 3, 0}, {1, 4, 3}}, 7}}, 2);
  EXPECT_EQ(layout.padded_numel(0), 8);
  EXPECT_EQ(layout.shard_numel(0), 4);
  const auto r0 = layout.pieces(0);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].param, 0u);
  EXPECT_EQ(r0[0].numel, 3);
  EXPECT_EQ(r0[1].param, 1u);
  EXPECT_EQ(r0[1].param_offset, 0);
  EXPECT_EQ(r0[1].shard_offset, 3);
  EXPECT_EQ(r0[1].numel, 1);
  const auto r1 = layout.pieces(1);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].param, 1u);
  EXPECT_EQ(r1[0].param_offset, 1);
  EXPECT_EQ(r1[0].shard_offset, 0);
  EXPECT_EQ(r1[0].numel, 3);
}

TEST(ShardLayout, RejectsOverlapsAndBadWorlds) {
  EXPECT_THROW(ShardLayout({{{{0, 3, 0}, {1, 3, 2}}, 6}}, 2), ConfigError);
  EXPECT_THROW(ShardLayout({{{{0, 3, 0}}, 2}}, 2), ConfigError);
  EXPECT_THROW(ShardLayout({}, 0), ConfigError);
  EXPECT_THROW(ShardLayout({}, 2).pieces(2), ConfigError);
}

struct Case {
  std::vector<int64_t> numels;        // per parameter
  std::vector<std::size_t> group_of;  // per parameter
  int world = 1;
};

Case random_case() {
  Case c;
  const int n = *rc::gen::inRange(1, 12);
  const int groups = *rc::gen::inRange(1, 5);
  for (int i = 0; i < n; ++i) {
    c.numels.push_back(*rc::gen::inRange<int64_t>(0, 40));
    c.group_of.push_back(*rc::gen::inRange<std::size_t>(0, groups));
  }
  c.world = *rc::gen::inRange(1, 9);
  return c;
}

// Groups in index order; parameters packed back to back in a random order,
// with random gaps, as any buffer layout a caller might choose.
std::vector<LayoutGroup> groups_of(const Case& c) {
  std::size_t count = 0;
  for (std::size_t g : c.group_of) count = std::max(count, g + 1);
  std::vector<LayoutGroup> groups(count);
  std::vector<std::size_t> order(c.numels.size());
  std::iota(order.begin(), order.end(), 0);
  for (std::size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[*rc::gen::inRange<std::size_t>(0, i)]);
  }
  for (std::size_t i : order) {
    LayoutGroup& g = groups[c.group_of[i]];
    g.numel += *rc::gen::inRange<int64_t>(0, 3);  // gap
    g.params.push_back({i, c.numels[i], g.numel});
    g.numel += c.numels[i];
  }
  return groups;
}

RC_GTEST_PROP(ShardLayout, PiecesOfAllRanksTileEveryParameterOnce, ()) {
  const Case c = random_case();
  const ShardLayout layout(groups_of(c), c.world);
  std::vector<std::vector<int>> covered(c.numels.size());
  for (std::size_t i = 0; i < c.numels.size(); ++i) covered[i].assign(c.numels[i], 0);
  for (int r = 0; r < c.world; ++r) {
    for (const ShardPiece& p : layout.pieces(r)) {
      RC_ASSERT(p.numel > 0);
      RC_ASSERT(p.shard_offset >= 0 && p.shard_offset + p.numel <= layout.shard_numel(p.group));
      RC_ASSERT(p.param_offset >= 0 && p.param_offset + p.numel <= c.numels[p.param]);
      for (int64_t e = 0; e < p.numel; ++e) ++covered[p.param][p.param_offset + e];
    }
  }
  for (const auto& v : covered) {
    for (int n : v) RC_ASSERT(n == 1);
  }
  for (std::size_t g = 0; g < layout.num_groups(); ++g) {
    RC_ASSERT(layout.padded_numel(g) % c.world == 0);
    RC_ASSERT(layout.padded_numel(g) >= layout.group(g).numel);
    RC_ASSERT(layout.padded_numel(g) < layout.group(g).numel + c.world);
  }
}

// Shard: rank r's shard of group g is slice r of the flat buffer (what
// reduce_scatter delivers). Gather: each rank writes its pieces back into the
// parameters (what the all-gather plus unpacking amounts to).
RC_GTEST_PROP(ShardLayout, ShardThenGatherReturnsTheOriginalTensors, ()) {
  const Case c = random_case();
  const std::vector<LayoutGroup> groups = groups_of(c);
  const ShardLayout layout(groups, c.world);
  std::vector<std::vector<double>> params(c.numels.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (int64_t e = 0; e < c.numels[i]; ++e) params[i].push_back(static_cast<double>(i * 1000 + e));
  }
  std::vector<std::vector<double>> buffers(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    buffers[g].assign(layout.padded_numel(g), -1.0);
    for (const LayoutParam& p : groups[g].params) {
      std::copy(params[p.param].begin(), params[p.param].end(), buffers[g].begin() + p.offset);
    }
  }
  std::vector<std::vector<double>> rebuilt(c.numels.size());
  for (std::size_t i = 0; i < rebuilt.size(); ++i) rebuilt[i].assign(c.numels[i], -2.0);
  for (int r = 0; r < c.world; ++r) {
    for (const ShardPiece& p : layout.pieces(r)) {
      const auto shard_begin = buffers[p.group].begin() + r * layout.shard_numel(p.group);
      std::copy(shard_begin + p.shard_offset, shard_begin + p.shard_offset + p.numel,
                rebuilt[p.param].begin() + p.param_offset);
    }
  }
  RC_ASSERT(rebuilt == params);
}

}  // namespace
}  // namespace paratrain::zero

// Buckets of key ranges (Note [Parameter-server buckets] in
// param_server/bucket_plan.h): worked examples on the Fashion-MNIST MLP's
// shapes, and properties over random shapes, server counts, layer groups and
// caps: every range of a server is in exactly one bucket, in order; a
// layer's neighbouring ranges are never cut apart; buckets stay within the
// cap unless one layer alone exceeds it; no two neighbours could have been
// merged; cap 0 is one bucket per range.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <stdexcept>

#include "paratrain/param_server/bucket_plan.h"

namespace paratrain::param_server {
namespace {

// configs/fashion_mnist_mlp.toml: fc0 784x256, fc1 256x128, fc2 128x10,
// weight then bias, float32; each layer reads its own two tensors.
const std::vector<int64_t> kMlpNumel{784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
const std::vector<int64_t> kFloat(6, 4);
const std::vector<int> kMlpLayers{0, 0, 1, 1, 2, 2};

TEST(BucketPlan, MlpOneServer256KiBIsFc0AloneThenFc1WithFc2) {
  const auto plan = plan_key_ranges(kMlpNumel, kFloat, 1);
  const auto buckets = plan_buckets(plan, kMlpLayers, kFloat, 256 * 1024);
  ASSERT_EQ(buckets.buckets.size(), 1u);
  // fc0 (803 KiB with its bias) is larger than the cap: a bucket by itself;
  // fc1 (131 KiB) and fc2 (5 KiB) fit together.
  const std::vector<Bucket> expected{{0, 0, 2, 784 * 256 + 256, (784 * 256 + 256) * 4},
                                     {0, 2, 6, 256 * 128 + 128 + 1280 + 10, (256 * 128 + 128 + 1280 + 10) * 4}};
  EXPECT_EQ(buckets.buckets[0], expected);
  EXPECT_EQ(buckets.bucket_of[0], (std::vector<int>{0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(buckets.messages(), 2);
  // A cap below fc2: one bucket per layer, never a bias alone.
  EXPECT_EQ(plan_buckets(plan, kMlpLayers, kFloat, 1024).messages(), 3);
  // Cap 0: the protocol before buckets, one message per range.
  EXPECT_EQ(plan_buckets(plan, kMlpLayers, kFloat, 0).messages(), 6);
}

TEST(BucketPlan, TwoServersBucketEachServersRangesApart) {
  const auto plan = plan_key_ranges(kMlpNumel, kFloat, 2);
  // Server 0: most of fc0.weight; server 1: its tail and everything after.
  ASSERT_EQ(plan.ranges_of(0).size(), 1u);
  ASSERT_EQ(plan.ranges_of(1).size(), 6u);
  const auto buckets = plan_buckets(plan, kMlpLayers, kFloat, 256 * 1024);
  ASSERT_EQ(buckets.buckets.size(), 2u);
  EXPECT_EQ(buckets.buckets[0].size(), 1u);
  // Server 1's fc0 part (the weight's tail and the bias) exceeds 256 KiB alone.
  EXPECT_EQ(buckets.bucket_of[1], (std::vector<int>{0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(buckets.messages(), 3);
}

TEST(BucketPlan, WithoutLayersEachTensorIsAUnit) {
  const auto plan = plan_key_ranges(kMlpNumel, kFloat, 1);
  // fc0.bias may now join fc1: no layer holds it back.
  EXPECT_EQ(plan_buckets(plan, {}, kFloat, 256 * 1024).bucket_of[0], (std::vector<int>{0, 1, 1, 1, 1, 1}));
}

TEST(BucketPlan, RejectsBadArguments) {
  const auto plan = plan_key_ranges({4, 4}, {4, 4}, 1);
  EXPECT_THROW(plan_buckets(plan, {}, {4, 4}, -1), std::invalid_argument);
  EXPECT_THROW(plan_buckets(plan, {0}, {4, 4}, 64), std::invalid_argument);
  EXPECT_THROW(plan_buckets(plan, {}, {4}, 64), std::invalid_argument);
}

RC_GTEST_PROP(BucketPlan, CoversEachRangeOnceInOrderWithinTheCapUnlessOneLayerIsLarger, ()) {
  const int n = *rc::gen::inRange(0, 12);
  std::vector<int64_t> numel, element_bytes;
  std::vector<int> group;
  int layer = 0;
  for (int i = 0; i < n; ++i) {
    numel.push_back(*rc::gen::inRange<int64_t>(0, 400));
    element_bytes.push_back(*rc::gen::element<int64_t>(1, 2, 4, 8));
    // Layers own runs of neighbouring tensors, as a model's layers do; a
    // tied weight read later is drawn as a jump back to an earlier group.
    if (i > 0 && *rc::gen::inRange(0, 3) == 0) ++layer;
    group.push_back(*rc::gen::inRange(0, 8) == 0 ? *rc::gen::inRange(0, layer + 1) : layer);
  }
  const int servers = *rc::gen::inRange(1, 6);
  const int64_t cap = *rc::gen::element<int64_t>(0, 1, 64, 256, 1024, 1 << 20);
  const bool layered = *rc::gen::arbitrary<bool>();
  const auto plan = plan_key_ranges(numel, element_bytes, servers);
  const auto buckets = plan_buckets(plan, layered ? group : std::vector<int>{}, element_bytes, cap);
  auto unit_of = [&](const KeyRange& r) { return layered ? group[r.tensor] : r.tensor; };

  RC_ASSERT(static_cast<int>(buckets.buckets.size()) == servers);
  int64_t messages = 0;
  for (int s = 0; s < servers; ++s) {
    const auto ranges = plan.ranges_of(s);
    const auto& mine = buckets.buckets[s];
    messages += static_cast<int64_t>(mine.size());
    RC_ASSERT(buckets.bucket_of[s].size() == ranges.size());
    // Coverage: the buckets tile [0, ranges) in order, none empty.
    int next = 0;
    for (size_t b = 0; b < mine.size(); ++b) {
      const auto& bucket = mine[b];
      RC_ASSERT(bucket.server == s);
      RC_ASSERT(bucket.first == next);
      RC_ASSERT(bucket.last > bucket.first);
      int64_t bucket_numel = 0, bytes = 0;
      for (int k = bucket.first; k < bucket.last; ++k) {
        RC_ASSERT(buckets.bucket_of[s][k] == static_cast<int>(b));
        bucket_numel += ranges[k].numel();
        bytes += ranges[k].numel() * element_bytes[ranges[k].tensor];
      }
      RC_ASSERT(bucket.numel == bucket_numel);
      RC_ASSERT(bucket.bytes == bytes);
      if (cap == 0) {
        RC_ASSERT(bucket.size() == 1);
      } else if (bucket.bytes > cap) {
        // Over the cap only as one unit: all of it one layer's neighbours.
        for (int k = bucket.first + 1; k < bucket.last; ++k) RC_ASSERT(unit_of(ranges[k]) == unit_of(ranges[k - 1]));
      }
      next = bucket.last;
    }
    RC_ASSERT(next == static_cast<int>(ranges.size()));
    if (cap == 0) continue;
    for (size_t b = 1; b < mine.size(); ++b) {
      const int k = mine[b].first;
      // A layer's neighbouring ranges are never cut apart.
      RC_ASSERT(unit_of(ranges[k]) != unit_of(ranges[k - 1]));
      // Greedy: the next bucket's first unit did not fit into this one.
      int64_t unit = 0;
      for (int j = k; j < mine[b].last && unit_of(ranges[j]) == unit_of(ranges[k]); ++j)
        unit += ranges[j].numel() * element_bytes[ranges[j].tensor];
      RC_ASSERT(mine[b - 1].bytes + unit > cap);
    }
  }
  RC_ASSERT(buckets.messages() == messages);
  // Deterministic: every rank computes the same plan.
  RC_ASSERT(plan_buckets(plan, layered ? group : std::vector<int>{}, element_bytes, cap).buckets == buckets.buckets);
}

}  // namespace
}  // namespace paratrain::param_server

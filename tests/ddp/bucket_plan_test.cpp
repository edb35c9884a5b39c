// Bucket assignment (pure logic): reverse order, caps, first bucket, dtypes,
// padding, and the invariant every plan must keep (each parameter exactly
// once, offsets packed) over many random models.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/bucket_plan.h"

namespace paratrain::ddp {
namespace {

std::vector<ParamSpec> floats(std::initializer_list<int64_t> numels) {
  std::vector<ParamSpec> out;
  for (int64_t n : numels) out.push_back({n, at::kFloat, at::kCPU});
  return out;
}

BucketPlanOptions caps(int64_t first, int64_t rest) {
  BucketPlanOptions o;
  o.first_bucket_cap_bytes = first;
  o.bucket_cap_bytes = rest;
  return o;
}

TEST(BucketPlan, OneBigBucketHoldsParametersInReverseRegistrationOrder) {
  auto plans = plan_buckets(floats({10, 20, 30, 40}));
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].params, (std::vector<std::size_t>{3, 2, 1, 0}));
  EXPECT_EQ(plans[0].offsets, (std::vector<int64_t>{0, 40, 70, 90}));
  EXPECT_EQ(plans[0].numel, 100);
  EXPECT_EQ(plans[0].padded_numel, 100);
}

TEST(BucketPlan, CapsSplitBucketsAndTheFirstBucketIsSmaller) {
  // 100 floats = 400 bytes each. First cap 400 B: the last parameter alone;
  // then 800 B: two parameters per bucket.
  auto plans = plan_buckets(floats({100, 100, 100, 100, 100}), caps(400, 800));
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].params, (std::vector<std::size_t>{4}));
  EXPECT_EQ(plans[1].params, (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(plans[2].params, (std::vector<std::size_t>{1, 0}));
}

TEST(BucketPlan, ParameterLargerThanTheCapGetsItsOwnBucket) {
  auto plans = plan_buckets(floats({10, 1000, 10}), caps(100, 100));
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].params, (std::vector<std::size_t>{2, 1}));  // 40 B + 4000 B crosses the cap
  EXPECT_EQ(plans[1].params, (std::vector<std::size_t>{0}));
}

TEST(BucketPlan, TinyCapGivesOneBucketPerParameter) {
  auto plans = plan_buckets(floats({5, 6, 7}), caps(1, 1));
  ASSERT_EQ(plans.size(), 3u);
  for (std::size_t b = 0; b < 3; ++b) EXPECT_EQ(plans[b].params, (std::vector<std::size_t>{2 - b}));
}

TEST(BucketPlan, EachBucketHasOneDtypeAndBucketsAreOrderedByCompletion) {
  std::vector<ParamSpec> specs = {
      {8, at::kFloat, at::kCPU},   // 0
      {8, at::kDouble, at::kCPU},  // 1
      {8, at::kFloat, at::kCPU},   // 2
      {8, at::kDouble, at::kCPU},  // 3
      {8, at::kFloat, at::kCPU},   // 4
  };
  // Caps large: one bucket per dtype. The double bucket's last parameter (1)
  // comes before the float bucket's (0) in the reverse walk.
  auto plans = plan_buckets(specs);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].dtype, at::kDouble);
  EXPECT_EQ(plans[0].params, (std::vector<std::size_t>{3, 1}));
  EXPECT_EQ(plans[1].dtype, at::kFloat);
  EXPECT_EQ(plans[1].params, (std::vector<std::size_t>{4, 2, 0}));
}

TEST(BucketPlan, PaddingRoundsEachBucketUpToTheMultiple) {
  BucketPlanOptions o = caps(40, 40);
  o.pad_to_multiple = 4;
  auto plans = plan_buckets(floats({3, 10, 5}), o);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].numel, 15);  // 5 + 10 floats = 60 B >= 40 B
  EXPECT_EQ(plans[0].padded_numel, 16);
  EXPECT_EQ(plans[1].numel, 3);
  EXPECT_EQ(plans[1].padded_numel, 4);
}

TEST(BucketPlan, EmptyModelGivesNoBuckets) { EXPECT_TRUE(plan_buckets({}).empty()); }

TEST(BucketPlan, BadOptionsAreConfigErrorsNamingTheOption) {
  auto expect_error = [](BucketPlanOptions o, const std::string& field) {
    try {
      plan_buckets(floats({1}), o);
      ADD_FAILURE() << "no error for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_error(caps(1, 0), "bucket_cap_bytes");
  expect_error(caps(0, 1), "first_bucket_cap_bytes");
  BucketPlanOptions pad;
  pad.pad_to_multiple = 0;
  expect_error(pad, "pad_to_multiple");
}

// Over random models: every parameter lands in exactly one bucket, offsets
// are packed in walk order, a bucket never mixes dtypes, only the last
// parameter added may push a bucket past its cap, and every parameter's
// bucket is at or after the bucket of any parameter registered after it with
// the same dtype (reverse order).
TEST(BucketPlan, InvariantsHoldForRandomModels) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<ParamSpec> specs(1 + rng() % 30);
    for (auto& s : specs) {
      s.numel = static_cast<int64_t>(rng() % 2000);
      s.dtype = rng() % 4 == 0 ? at::kDouble : at::kFloat;
    }
    BucketPlanOptions o = caps(1 + rng() % 4000, 1 + rng() % 16000);
    o.pad_to_multiple = 1 + rng() % 5;
    auto plans = plan_buckets(specs, o);

    std::vector<int> bucket_of(specs.size(), -1);
    for (std::size_t b = 0; b < plans.size(); ++b) {
      const BucketPlan& p = plans[b];
      ASSERT_FALSE(p.params.empty());
      int64_t offset = 0;
      int64_t bytes = 0;
      for (std::size_t i = 0; i < p.params.size(); ++i) {
        const std::size_t k = p.params[i];
        ASSERT_EQ(bucket_of[k], -1) << "parameter " << k << " in two buckets";
        bucket_of[k] = static_cast<int>(b);
        ASSERT_EQ(specs[k].dtype, p.dtype);
        ASSERT_EQ(p.offsets[i], offset);
        if (i > 0) {
          ASSERT_LT(k, p.params[i - 1]) << "not in reverse order";
        }
        const int64_t cap = std::max(o.bucket_cap_bytes, o.first_bucket_cap_bytes);
        offset += specs[k].numel;
        bytes += specs[k].numel * static_cast<int64_t>(c10::elementSize(p.dtype));
        if (i + 1 < p.params.size()) {
          ASSERT_LT(bytes, cap) << "bucket " << b << " kept growing past its cap";
        }
      }
      ASSERT_EQ(p.numel, offset);
      ASSERT_GE(p.padded_numel, p.numel);
      ASSERT_LT(p.padded_numel - p.numel, o.pad_to_multiple);
      ASSERT_EQ(p.padded_numel % o.pad_to_multiple, 0);
    }
    for (std::size_t k = 0; k < specs.size(); ++k) ASSERT_NE(bucket_of[k], -1) << "parameter " << k << " lost";
    for (std::size_t k = 0; k + 1 < specs.size(); ++k) {
      for (std::size_t j = k + 1; j < specs.size(); ++j) {
        if (specs[j].dtype == specs[k].dtype) {
          ASSERT_GE(bucket_of[k], bucket_of[j]);
        }
      }
    }
  }
}

}  // namespace
}  // namespace paratrain::ddp

// How pushes travel: from gradient hooks during backward (ps.overlap, which
// also waits for each layer's pulled parameters just before it runs in the
// next forward) and in fp16 (ps.push_dtype). Overlapped pushes and pulls
// are the same messages sent and used sooner, so the run must equal the one
// pushing after backward and pulling at once bit for bit, and one process
// to the oracle tolerance; the metrics prove the hooks pushed and the
// forward waited layer by layer.
// fp16 pushes lose only each worker's rounding of its gradient: a stated
// tolerance, the proof that they did differ, and half the bytes.
#include <gtest/gtest.h>
#include <torch/torch.h>


#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/param_server/protocol.h"
#include "tests/param_server/ps_training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

using testing::Params;
using testing::relative_diff;
using testing::small_config;
using testing::train;

constexpr double kTolerance = 1e-5;  // as in ps_oracle_test.cpp

// The workers' records of a run with small_config's run name.
std::vector<nlohmann::json> push_records(const std::string& dir) { return testing::worker_records(dir + "/t/version_0"); }

void expect_equal(const Params& a, const Params& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(PushMessages, Fp32RoundTripsExactlyAndFp16AsTheHalfRounding) {
  for (int64_t n : {1, 2, 7, 10}) {
    auto grad = torch::randn({n}, torch::TensorOptions().dtype(torch::kFloat)) * 1e-2;
    auto m32 = encode_push(3, 2, grad, PushDtype::kFp32);
    EXPECT_EQ(m32.numel(), kHeader + n);
    EXPECT_EQ(m32[0].item<float>(), 3.0f);
    EXPECT_EQ(m32[1].item<float>(), 2.0f);
    EXPECT_TRUE(torch::equal(decode_push(m32, n, PushDtype::kFp32), grad));
    auto m16 = encode_push(3, 2, grad, PushDtype::kFp16);
    EXPECT_EQ(m16.numel(), kHeader + (n + 1) / 2) << "two halves per float32 slot";
    EXPECT_EQ(m16[0].item<float>(), 3.0f) << "the header stays float32";
    EXPECT_TRUE(torch::equal(decode_push(m16, n, PushDtype::kFp16), grad.to(torch::kHalf).to(torch::kFloat)));
  }
  EXPECT_THROW(parse_push_dtype("bf16"), ConfigError);
}

// Both optimizers, 2 servers (a tensor split across them) x 2 workers, and
// once with gradient accumulation (the hooks push .grad + the last
// micro-batch's gradient).
TEST(PsOverlap, PushesFromHooksEqualPushesAfterBackwardBitForBitAndOneProcess) {
  auto dir = paratrain::testing::temp_dir("ps_overlap");
  for (std::string optimizer : {"sgd", "adam"}) {
    for (int64_t accumulate : {1, 2}) {
      const std::string tag = fmt::format("{}_acc{}", optimizer, accumulate);
      auto base = small_config(dir + "/single_" + tag, optimizer);
      base.train.accumulate = accumulate;
      const Params single = train(base, 1);
      Params runs[2];
      for (bool overlap : {false, true}) {
        auto cfg = base;
        cfg.run.output_dir = dir + (overlap ? "/overlap_" : "/after_") + tag;
        cfg.ps.servers = 2;
        cfg.ps.overlap = overlap;
        cfg.ps.bucket_kb = 0;  // a message per range, counted below (buckets: bucket_test.cpp)
        runs[overlap] = train(cfg, 4);
        EXPECT_LT(relative_diff(runs[overlap], single), kTolerance) << tag << " overlap " << overlap;
        const auto records = push_records(cfg.run.output_dir);
        ASSERT_EQ(records.size(), 2u);
        for (const auto& r : records) {
          // 6 tensors, one of them split over the 2 servers: 7 ranges a step.
          const int64_t ranges = 7 * cfg.train.max_steps;
          EXPECT_EQ(r["ranges_pushed_in_backward"].get<int64_t>(), overlap ? ranges : 0) << r;
          EXPECT_EQ(r["ranges_pushed_after_backward"].get<int64_t>(), overlap ? 0 : ranges) << r;
          // Every step but the first starts its forward with the pull due
          // (Note [Pulling during the forward]); fc0 (3 ranges: its weight
          // is the one split) is waited for before the first layer, the 4
          // ranges of fc1 and fc2 after it ran.
          const int64_t pulls = cfg.train.max_steps - 1;
          EXPECT_EQ(r["forwards_pulling"].get<int64_t>(), overlap ? pulls : 0) << r;
          EXPECT_EQ(r["ranges_pulled_in_forward"].get<int64_t>(), overlap ? 4 * pulls : 0) << r;
        }
      }
      expect_equal(runs[true], runs[false]);
    }
  }
}

// Each element of a worker's gradient is rounded to fp16 (relative error
// <= 2^-11 ~ 4.9e-4 of its value, more for values below fp16's normal range
// ~6e-5, which these gradients have); SGD moves each parameter by lr x
// gradient, so after 20 steps the parameters differ from one process by a
// small share of one step's update: measured 8.7e-5 here (deterministic: sync
// sums in worker order), bounded at 2e-4.
TEST(PsPushDtype, Fp16PushesStayCloseToOneProcessAndHalveThePushBytes) {
  auto dir = paratrain::testing::temp_dir("ps_fp16");
  const Params single = train(small_config(dir + "/single", "sgd"), 1);
  int64_t bytes[2] = {0, 0};
  double diffs[2] = {0, 0};
  for (bool fp16 : {false, true}) {
    auto cfg = small_config(dir + (fp16 ? "/fp16" : "/fp32"), "sgd");
    cfg.ps.servers = 1;
    cfg.ps.push_dtype = fp16 ? "fp16" : "fp32";
    diffs[fp16] = relative_diff(train(cfg, 3), single);
    for (const auto& r : push_records(cfg.run.output_dir)) bytes[fp16] += r["push_bytes"].get<int64_t>();
  }
  RecordProperty("fp16_diff", std::to_string(diffs[1]));
  EXPECT_LT(diffs[0], kTolerance);
  EXPECT_LT(diffs[1], 2e-4);
  EXPECT_GT(diffs[1], 1e-7) << "fp16 pushes gave the fp32 result: they were not rounded";
  EXPECT_LT(bytes[1], bytes[0] * 0.55) << bytes[1] << " vs " << bytes[0];
  EXPECT_GT(bytes[1], bytes[0] * 0.45) << bytes[1] << " vs " << bytes[0];
}

}  // namespace
}  // namespace paratrain::param_server

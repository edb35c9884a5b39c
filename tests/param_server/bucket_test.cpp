// Buckets of key ranges through the whole Trainer (Note [Parameter-server
// buckets] in param_server/bucket_plan.h): a bucketed run equals the one
// message per range run bit for bit (the same values, only packed
// differently), and one process to the oracle tolerance; the messages on
// the wire, counted by a group that sees every send, are those of the
// bucket plan, so small tensors share a message, while ps.bucket_kb = 0
// sends one per range (the negative control).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <atomic>

#include "paratrain/param_server/protocol.h"
#include "paratrain/train/trainer.h"
#include "tests/param_server/ps_training.h"
#include "tests/support/forwarding_group.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

using testing::Params;
using testing::relative_diff;
using testing::small_config;

constexpr double kTolerance = 1e-5;  // as in ps_oracle_test.cpp

// Counts the push messages (workers' sends on push tags) and reply messages
// (servers' sends on reply tags) of one rank.
class CountingGroup : public paratrain::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  comm::WorkHandle send(const at::Tensor& t, int dst, int tag) override {
    if (tag >= push_tag(0) && tag < push_tag(0) + kMaxRangesPerServer) ++pushes;
    if (tag >= reply_tag(0) && tag < reply_tag(0) + kMaxRangesPerServer) ++replies;
    return ForwardingGroup::send(t, dst, tag);
  }
  int64_t pushes = 0, replies = 0;
};

struct CountedRun {
  Params params;
  int64_t pushes = 0, replies = 0;  // over all ranks
};

CountedRun train_counting(const train::TrainConfig& cfg, int world) {
  std::vector<Params> per_rank(world);
  std::vector<std::array<int64_t, 2>> counts(world);
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    CountingGroup counting(g);
    train::Trainer t(cfg, counting);
    t.fit();
    per_rank[g.rank()] = t.full_parameters();
    counts[g.rank()] = {counting.pushes, counting.replies};
  });
  CountedRun run{per_rank[0]};
  for (const auto& c : counts) {
    run.pushes += c[0];
    run.replies += c[1];
  }
  return run;
}

void expect_equal(const Params& a, const Params& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what << " " << a[i].first;
}

// small_config's MLP (6x6 inputs, 24 and 16 hidden) over 2 servers: server 0
// holds most of fc0.weight (1 range), server 1 its tail, fc0.bias and fc1,
// fc2 (6 ranges). Messages per step and worker for each ps.bucket_kb:
//   0   -> 7 (one per range: every bias alone);
//   1   -> 4 (server 1: fc0's tail with its bias, fc1, fc2: a layer each,
//             since no two fit into 1 KiB together);
//   256 -> 2 (the default: one bucket per server).
// pull_messages_in_forward: what arrives after the first layer ran, per
// pull: fc1 and fc2 (4 ranges as 4 messages, or 2 buckets), or nothing
// when one bucket holds every layer.
struct Case {
  int64_t bucket_kb, messages, pulled_in_forward;
};
constexpr std::array<Case, 3> kCases{{{0, 7, 4}, {1, 4, 2}, {256, 2, 0}}};

TEST(PsBuckets, BucketedEqualsOneMessagePerRangeBitForBitAndOneProcessWithTheMessagesOfThePlan) {
  auto dir = paratrain::testing::temp_dir("ps_buckets");
  for (std::string optimizer : {"sgd", "adam"}) {
    const Params single = testing::train(small_config(dir + "/single_" + optimizer, optimizer), 1);
    Params per_range;
    for (const auto& c : kCases) {
      auto cfg = small_config(dir + fmt::format("/{}_kb{}", optimizer, c.bucket_kb), optimizer);
      cfg.ps.servers = 2;
      cfg.ps.bucket_kb = c.bucket_kb;
      const CountedRun run = train_counting(cfg, 4);
      const std::string what = fmt::format("{} bucket_kb {}", optimizer, c.bucket_kb);
      EXPECT_LT(relative_diff(run.params, single), kTolerance) << what;
      if (c.bucket_kb == 0) {
        per_range = run.params;
      } else {
        expect_equal(run.params, per_range, what);
      }
      const int64_t steps = cfg.train.max_steps, workers = 2;
      // On the wire: each worker pushes the plan's messages every step, and
      // the servers answer each worker with as many.
      EXPECT_EQ(run.pushes, c.messages * steps * workers) << what;
      EXPECT_EQ(run.replies, c.messages * steps * workers) << what;
      const int64_t numel = 36 * 24 + 24 + 24 * 16 + 16 + 16 * 10 + 10;
      for (const auto& r : testing::worker_records(cfg.run.output_dir + "/t/version_0")) {
        EXPECT_EQ(r["messages_per_step"].get<int64_t>(), c.messages) << r;
        EXPECT_EQ(r["push_messages_in_backward"].get<int64_t>(), c.messages * steps) << r;
        EXPECT_EQ(r["push_messages_after_backward"].get<int64_t>(), 0) << r;
        EXPECT_EQ(r["pull_messages"].get<int64_t>(), c.messages * steps) << r;
        EXPECT_EQ(r["pull_messages_in_forward"].get<int64_t>(), c.pulled_in_forward * (steps - 1)) << r;
        EXPECT_EQ(r["ranges_pushed_in_backward"].get<int64_t>(), 7 * steps) << r;
        // Each message is a 3-float header and its ranges' gradients.
        EXPECT_EQ(r["push_bytes"].get<int64_t>(), (numel + 3 * c.messages) * 4 * steps) << r;
      }
    }
  }
}

// The other paths keep their results under buckets: fp16 pushes round the
// same elements (the padding moves, the values do not), pushes after
// backward (ps.overlap = false) send the same buckets, and ssp with
// staleness 0 is sync.
TEST(PsBuckets, Fp16NoOverlapAndSspZeroEqualOneMessagePerRange) {
  auto dir = paratrain::testing::temp_dir("ps_buckets_paths");
  for (int variant = 0; variant < 3; ++variant) {
    Params runs[2];
    for (int64_t kb : {0, 256}) {
      auto cfg = small_config(dir + fmt::format("/v{}_kb{}", variant, kb), "adam");
      cfg.ps.servers = 2;
      cfg.ps.bucket_kb = kb;
      if (variant == 0) cfg.ps.push_dtype = "fp16";
      if (variant == 1) cfg.ps.overlap = false;
      if (variant == 2) {
        cfg.ps.mode = "ssp";
        cfg.ps.staleness = 0;
      }
      runs[kb != 0] = testing::train(cfg, 4);
      if (variant == 1) {
        for (const auto& r : testing::worker_records(cfg.run.output_dir + "/t/version_0")) {
          EXPECT_EQ(r["push_messages_after_backward"].get<int64_t>(), (kb ? 2 : 7) * cfg.train.max_steps) << r;
        }
      }
    }
    expect_equal(runs[1], runs[0], fmt::format("variant {}", variant));
  }
}

}  // namespace
}  // namespace paratrain::param_server

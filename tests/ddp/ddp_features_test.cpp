// DDP's features, each against an independent reference: bucketed vs the
// naive twin, bucket sizes, gradient views, no_sync accumulation, broadcasts,
// the launch order and timing stats, and errors. Unused parameters: see
// ddp_unused_test.cpp.
// Tolerance where floats are compared: 1e-5 relative, as in ddp_oracle_test.cpp
// (float32 summation order differs between the strategies being compared).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/ddp/training.h"
#include "tests/ddp/two_head_net.h"
#include "tests/support/multi_rank.h"

namespace paratrain::ddp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 99;

std::size_t bucket_count(ModelKind kind, const DdpOptions& o) {
  auto model = make_model(kind, kSeed);
  std::vector<ParamSpec> specs;
  for (const auto& p : trainable_parameters(*model)) specs.push_back({p.tensor.numel(), at::kFloat, at::kCPU});
  return plan_buckets(specs, o.reducer.buckets).size();
}

TEST(Ddp, BucketedReducerEqualsNaiveTwin) {
  const Problem problem = make_problem(10, 16, /*seed=*/3);
  RankRun run;
  run.world = 4;
  run.ddp = with_caps(1, 1);  // one bucket per parameter: most launches, most reordering risk
  ASSERT_EQ(bucket_count(run.model, run.ddp), 6u);
  const auto bucketed = train_ranks(run, problem);
  run.sync = Sync::kNaive;
  const auto naive = train_ranks(run, problem);
  for (int r = 0; r < run.world; ++r) EXPECT_LE(max_relative_diff(bucketed[r], naive[r]), kTolerance) << r;
}

// Tiny and big buckets agree with each other *and* with the oracle: two runs
// that both skipped synchronization would agree with each other too, so the
// oracle comparison is what makes this test able to fail (the Sync::kNone
// control shows the oracle is far from an unsynchronized run).
TEST(Ddp, ManyTinyBucketsEqualOneBigBucket) {
  const Problem problem = make_problem(10, 16, /*seed=*/4);
  RankRun run;
  run.model = ModelKind::kCnn;
  run.world = 2;
  const Snapshot oracle = train_single_process(run.model, problem, run.seed);
  run.ddp = with_caps(1, 1);
  ASSERT_EQ(bucket_count(run.model, run.ddp), 8u);
  const auto tiny = train_ranks(run, problem);
  run.ddp = DdpOptions{};
  ASSERT_EQ(bucket_count(run.model, run.ddp), 1u);
  const auto big = train_ranks(run, problem);
  for (int r = 0; r < run.world; ++r) {
    EXPECT_LE(max_relative_diff(tiny[r], big[r]), kTolerance) << r;
    EXPECT_LE(max_relative_diff(tiny[r], oracle), kTolerance) << r;
    EXPECT_LE(max_relative_diff(big[r], oracle), kTolerance) << r;
  }
  run.sync = Sync::kNone;
  run.different_seeds = false;
  const auto unsynced = train_ranks(run, problem);
  for (int r = 0; r < run.world; ++r) EXPECT_GT(max_relative_diff(unsynced[r], oracle), 1e-2) << r;
}

TEST(Ddp, GradientsAsBucketViewsTrainLikeCopiedGradients) {
  const Problem problem = make_problem(10, 16, /*seed=*/5);
  RankRun run;
  run.world = 2;
  run.ddp = with_caps(1024, 4096);  // a few buckets
  const auto copied = train_ranks(run, problem);
  run.ddp.reducer.gradient_as_bucket_view = true;
  const auto viewed = train_ranks(run, problem);
  // Identical to each other, and synchronized: equal to the oracle, which an
  // unsynchronized run is not (DdpOracle.WithoutGradientSyncRanksDivergeFromOracle).
  const Snapshot oracle = train_single_process(run.model, problem, run.seed);
  for (int r = 0; r < run.world; ++r) {
    EXPECT_TRUE(identical(copied[r], viewed[r])) << r;
    EXPECT_LE(max_relative_diff(viewed[r], oracle), kTolerance) << r;
  }

  // And the gradients really live in the bucket buffers: with one bucket all
  // .grad tensors share one storage in view mode, none in copy mode.
  for (bool as_view : {true, false}) {
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
      auto model = make_model(ModelKind::kMlp, kSeed);
      DdpOptions o;
      o.reducer.gradient_as_bucket_view = as_view;
      DistributedDataParallel ddp(model, group, o);
      ddp.prepare_forward();
      model->forward(problem.batch_inputs(0)).sum().backward();
      auto params = model->parameters();
      EXPECT_EQ(params.front().grad().is_alias_of(params.back().grad()), as_view);
    });
  }
}

// k micro-batches, the first k-1 under no_sync(), then one synchronized
// backward, equal one step on a k-times-larger batch (each micro-batch loss
// is divided by k so the accumulated gradient is the mean over k*b rows).
// And no_sync() really skips communication: no all-reduce during its backwards.
TEST(Ddp, NoSyncAccumulationEqualsOneLargerBatch) {
  constexpr int kWorld = 2;
  constexpr int kMicro = 3;
  constexpr int64_t kMicroRows = 2;  // per rank
  const Problem problem = make_problem(5, kWorld * kMicro * kMicroRows, /*seed=*/6);
  const Snapshot oracle = train_single_process(ModelKind::kMlp, problem, kSeed);

  std::vector<Snapshot> ranks(kWorld);
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    CountingGroup counting(group);
    auto model = make_model(ModelKind::kMlp, kSeed + group.rank());
    DistributedDataParallel ddp(model, counting);
    const std::size_t buckets = ddp.reducer().plans().size();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < problem.steps; ++step) {
      const auto x = shard(problem.batch_inputs(step), group.rank(), kWorld);
      const auto y = shard(problem.batch_targets(step), group.rank(), kWorld);
      auto micro_backward = [&](int m) {
        ddp.prepare_forward();
        auto out = model->forward(x.narrow(0, m * kMicroRows, kMicroRows));
        (torch::nn::functional::cross_entropy(out, y.narrow(0, m * kMicroRows, kMicroRows)) / kMicro).backward();
      };
      opt.zero_grad();
      const int before = counting.all_reduces();
      {
        auto guard = ddp.no_sync();
        EXPECT_FALSE(ddp.reducer().sync_enabled());
        for (int m = 0; m < kMicro - 1; ++m) micro_backward(m);
      }
      EXPECT_TRUE(ddp.reducer().sync_enabled());
      EXPECT_EQ(counting.all_reduces(), before) << "no_sync() backward communicated";
      micro_backward(kMicro - 1);
      EXPECT_EQ(counting.all_reduces(), before + static_cast<int>(buckets));
      opt.step();
    }
    EXPECT_EQ(ddp.reducer().synced_steps(), problem.steps);
    ranks[group.rank()] = snapshot(*model);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_LE(max_relative_diff(ranks[r], oracle), kTolerance) << r;
}

TEST(Ddp, ConstructionMakesRanksIdentical) {
  constexpr int kWorld = 4;
  std::vector<Snapshot> before(kWorld), after(kWorld);
  std::vector<float> stat_after(kWorld);
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    TwoHeadNet net = make_two_head(kSeed + 10 * group.rank());
    net->stat.fill_(static_cast<float>(group.rank() + 1));
    before[group.rank()] = snapshot(*net);
    DistributedDataParallel ddp(net.ptr(), group);
    after[group.rank()] = snapshot(*net);
    stat_after[group.rank()] = net->stat.item<float>();
  });
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_FALSE(identical(before[r], before[0])) << "seeds should give different initial models";
    EXPECT_TRUE(identical(after[r], before[0])) << "rank " << r << " did not get rank 0's parameters";
    EXPECT_EQ(stat_after[r], 1.0f) << "rank " << r << " did not get rank 0's buffer";
  }
}

TEST(Ddp, BuffersAreBroadcastBeforeEachForwardWhenEnabled) {
  const Problem problem = make_problem(3, 8, /*seed=*/11);
  for (bool broadcast : {true, false}) {
    std::vector<std::vector<float>> seen(2);  // stat after prepare_forward(), per step
    DdpOptions o;
    o.broadcast_buffers = broadcast;
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
      TwoHeadNet net = make_two_head(kSeed);
      DistributedDataParallel ddp(net.ptr(), group, o);
      for (int step = 0; step < problem.steps; ++step) {
        ddp.prepare_forward();
        seen[group.rank()].push_back(net->stat.item<float>());
        loss_of(net, problem, step, group.rank(), 2, true).backward();
      }
    });
    // Step 0 starts from the construction broadcast; later steps differ
    // between ranks exactly when buffers are not broadcast.
    for (int step = 1; step < problem.steps; ++step) {
      EXPECT_EQ(seen[0][step] == seen[1][step], broadcast) << "step " << step << " broadcast " << broadcast;
    }
  }
}

TEST(Ddp, DifferentModelsOnRanksAreAConfigError) {
  std::vector<std::string> messages(2);
  EXPECT_THROW(paratrain::testing::run_ranks(2,
                                             [&](comm::ProcessGroup& group) {
                                               auto model = make_model(group.rank() == 0 ? ModelKind::kMlp
                                                                                         : ModelKind::kCnn,
                                                                       kSeed);
                                               try {
                                                 DistributedDataParallel ddp(model, group);
                                               } catch (const ConfigError& e) {
                                                 messages[group.rank()] = e.what();
                                                 throw;
                                               }
                                             }),
               ConfigError);
  for (const auto& m : messages) {
    EXPECT_NE(m.find("ranks hold different models"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 has 8 parameters"), std::string::npos) << m;
  }
}

// Buckets launch inside backward, in index order, as soon as they are ready:
// bucket 0 (the last layer) starts before the first layer's gradient exists.
// With launching switched to "after backward", launched_ms[0] would come after
// every ready_ms.
TEST(Ddp, BucketsLaunchDuringBackwardInIndexOrder) {
  const Problem problem = make_problem(1, 16, /*seed=*/13);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    DistributedDataParallel ddp(model, group, with_caps(1, 1));
    ddp.prepare_forward();
    auto x = shard(problem.batch_inputs(0), group.rank(), 2);
    auto y = shard(problem.batch_targets(0), group.rank(), 2);
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();

    const StepStats s = ddp.last_step_stats();
    ASSERT_EQ(s.buckets.size(), 6u);
    for (std::size_t b = 0; b < s.buckets.size(); ++b) {
      const BucketTiming& t = s.buckets[b];
      EXPECT_GE(t.ready_ms, 0) << b;
      EXPECT_GE(t.launched_ms, t.ready_ms) << b;
      EXPECT_GE(t.completed_ms, t.launched_ms) << b;
      EXPECT_LE(t.launched_ms, s.backward_ms) << b;
      if (b > 0) {
        EXPECT_GE(t.launched_ms, s.buckets[b - 1].launched_ms) << b;
      }
    }
    EXPECT_LE(s.buckets.front().launched_ms, s.buckets.back().ready_ms);
    EXPECT_GT(s.comm_ms(), 0);
    EXPECT_GE(s.hidden_share(), 0);
    EXPECT_LE(s.hidden_share(), 1);
    EXPECT_GE(s.wait_ms, 0);
    EXPECT_EQ(ddp.reducer().synced_steps(), 1);
  });
}

}  // namespace
}  // namespace paratrain::ddp::testing

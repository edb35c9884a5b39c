// PowerSGD as DDP's comm hook (data_parallel/ddp/powersgd.h), ranks as
// threads. The test MLP's weights are 32x64, 32x32 and 10x32; biases go
// uncompressed.
//
// - Full rank (r = min(n, m), every matrix compressed): the approximation is
//   exact, so training equals the single-process oracle. Tolerance 1e-4:
//   QR and two extra float32 products per step round differently from a
//   plain sum (measured 2e-7 after 20 steps); rank 1 is off by > 1e-2, the
//   negative control that the factors really replaced the gradients.
// - Error feedback (rank 1, parameters held fixed so every step's true
//   gradient is known): sum over steps of the averages DDP delivered + the
//   ranks' mean error = sum of the true averages. Exact in real arithmetic;
//   float32 rounding over 8 steps stays under 1e-4 relative (measured 4e-7). Without error
//   feedback the same sum misses by > 0.1 (what rank 1 drops each step).
// - start_step: before it the hook is a plain all-reduce (bitwise equal to
//   DDP without a hook); after it the factors take over.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/powersgd.h"
#include "tests/ddp/training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::ddp::testing {
namespace {

constexpr int kSteps = 20;

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", x);
  return buf;
}

constexpr int64_t kGlobalBatch = 16;
constexpr uint64_t kSeed = 1234;

// A RankRun whose every rank gets its own PowerSgd with `options`.
RankRun powersgd_run(const PowerSgdOptions& options, int world = 2) {
  RankRun run;
  run.world = world;
  run.seed = kSeed;
  run.per_rank = [options](DdpOptions& ddp) {
    auto powersgd = std::make_shared<PowerSgd>(options);
    ddp.reducer.comm_hook = powersgd->hook();
    return std::function<void(DistributedDataParallel&)>(
        [powersgd](DistributedDataParallel& d) { powersgd->attach(d.reducer()); });
  };
  return run;
}

TEST(PowerSgd, FullRankEqualsTheSingleProcessOracle) {
  const Problem problem = make_problem(kSteps, kGlobalBatch, /*seed=*/7);
  const Snapshot oracle = train_single_process(ModelKind::kMlp, problem, kSeed);

  PowerSgdOptions full;
  full.rank = 64;  // clipped to min(n, m) per matrix
  full.min_compression_rate = 0;
  for (int world : {2, 4}) {
    const auto ranks = train_ranks(powersgd_run(full, world), problem);
    const double diff = max_relative_diff(ranks[0], oracle);
    RecordProperty("full_rank_diff_w" + std::to_string(world), sci(diff));
    EXPECT_LE(diff, 1e-4) << world << " ranks";
    for (int r = 1; r < world; ++r) EXPECT_TRUE(identical(ranks[r], ranks[0])) << "rank " << r;
  }

  // Several buckets in flight at once: each step's Q all-reduces must reach
  // the wire in the same order on every rank (a dedicated group, issued in
  // bucket order), or Gloo pairs one rank's Q of bucket 0 with another's P
  // of bucket 1 and aborts the process.
  RankRun split = powersgd_run(full);
  split.ddp = with_caps(/*first_bucket_cap=*/256, /*bucket_cap=*/4096);
  const auto buckets = train_ranks(split, problem);
  EXPECT_LE(max_relative_diff(buckets[0], oracle), 1e-4) << "several buckets";
  EXPECT_TRUE(identical(buckets[1], buckets[0]));

  PowerSgdOptions low;
  low.rank = 1;
  low.min_compression_rate = 0;
  const auto ranks = train_ranks(powersgd_run(low), problem);
  EXPECT_GT(max_relative_diff(ranks[0], oracle), 1e-2) << "rank 1 changed nothing: was the hook used?";
  EXPECT_TRUE(identical(ranks[1], ranks[0])) << "replicas must apply the same approximation";
}

// Returns the worst relative miss of the accumulated-update identity.
double accumulated_identity_miss(bool error_feedback) {
  constexpr int world = 2, steps = 8;
  const Problem problem = make_problem(steps, kGlobalBatch, /*seed=*/11);
  // The true averages: the global batch's gradient at the (fixed) start.
  Snapshot truth;
  {
    auto model = make_model(ModelKind::kMlp, kSeed);
    for (int s = 0; s < steps; ++s) {
      model->zero_grad();
      torch::nn::functional::cross_entropy(model->forward(problem.batch_inputs(s)), problem.batch_targets(s))
          .backward();
      const auto params = model->named_parameters();
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (s == 0) truth.emplace_back(params[i].key(), params[i].value().grad().clone());
        else truth[i].second.add_(params[i].value().grad());
      }
    }
  }
  std::vector<Snapshot> delivered(world), errors(world);
  std::vector<std::shared_ptr<models::Model>> models(world);
  for (int r = 0; r < world; ++r) models[r] = make_model(ModelKind::kMlp, kSeed);
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    auto model = models[rank];
    PowerSgdOptions o;
    o.rank = 1;
    o.min_compression_rate = 0;
    o.error_feedback = error_feedback;
    auto powersgd = std::make_shared<PowerSgd>(o);
    DdpOptions options;
    options.reducer.comm_hook = powersgd->hook();
    DistributedDataParallel ddp(model, group, options);
    powersgd->attach(ddp.reducer());
    const auto params = model->named_parameters();
    Snapshot sum;
    for (const auto& p : params) sum.emplace_back(p.key(), at::zeros_like(p.value()));
    for (int s = 0; s < steps; ++s) {
      ddp.prepare_forward();
      model->zero_grad();
      torch::nn::functional::cross_entropy(model->forward(shard(problem.batch_inputs(s), rank, world)),
                                           shard(problem.batch_targets(s), rank, world))
          .backward();
      for (std::size_t i = 0; i < params.size(); ++i) sum[i].second.add_(params[i].value().grad());
    }
    // Each parameter's error, cut out of its bucket's (zero without feedback).
    Snapshot error;
    for (const auto& p : params) error.emplace_back(p.key(), at::zeros_like(p.value()));
    const auto& plans = ddp.reducer().plans();
    for (std::size_t b = 0; b < plans.size(); ++b) {
      const at::Tensor e = powersgd->error(b);
      if (!e.defined()) continue;
      for (std::size_t k = 0; k < plans[b].params.size(); ++k) {
        at::Tensor& slot = error[plans[b].params[k]].second;
        slot.copy_(e.narrow(0, plans[b].offsets[k], slot.numel()).view(slot.sizes()));
      }
    }
    delivered[rank] = std::move(sum);
    errors[rank] = std::move(error);
  });
  Snapshot reconstructed = delivered[0];
  for (std::size_t i = 0; i < reconstructed.size(); ++i) {
    reconstructed[i].second = reconstructed[i].second.clone();
    for (int r = 0; r < world; ++r) reconstructed[i].second.add_(errors[r][i].second, 1.0 / world);
  }
  return max_relative_diff(reconstructed, truth);
}

TEST(PowerSgd, ErrorFeedbackDelaysWhatCompressionDropsButLosesNothing) {
  const double with_feedback = accumulated_identity_miss(true);
  const double without = accumulated_identity_miss(false);
  RecordProperty("identity_miss_with_feedback", sci(with_feedback));
  RecordProperty("identity_miss_without_feedback", sci(without));
  EXPECT_LE(with_feedback, 1e-4);
  EXPECT_GT(without, 0.1) << "rank-1 compression without feedback should lose part of the gradient";
}

TEST(PowerSgd, PlainAllReduceBeforeStartStep) {
  const Problem problem = make_problem(kSteps, kGlobalBatch, /*seed=*/7);
  RankRun plain;
  plain.seed = kSeed;
  const auto reference = train_ranks(plain, problem);

  PowerSgdOptions later;
  later.rank = 1;
  later.min_compression_rate = 0;
  later.start_step = kSteps;  // never reached
  EXPECT_TRUE(identical(train_ranks(powersgd_run(later), problem)[0], reference[0]));

  later.start_step = kSteps / 2;
  const auto compressed = train_ranks(powersgd_run(later), problem);
  EXPECT_GT(max_relative_diff(compressed[0], reference[0]), 1e-3) << "compression never started";
}

TEST(PowerSgd, CompressesOnlyMatricesWorthIt) {
  paratrain::testing::run_ranks(1, [](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    auto powersgd = std::make_shared<PowerSgd>(PowerSgdOptions{.rank = 4});
    DdpOptions options;
    options.reducer.comm_hook = powersgd->hook();
    DistributedDataParallel ddp(model, group, options);
    powersgd->attach(ddp.reducer());
    // 32x64, 32x32, 10x32 at rank 4 (rates 5.3, 4, 1.9 against 2): the
    // first two as factors, the last weight and the biases plain.
    const int64_t sent = 4 * (32 + 64) + 4 * (32 + 32) + 10 * 32 + 32 + 32 + 10;
    EXPECT_EQ(powersgd->floats_sent_per_step(), sent);
    EXPECT_EQ(powersgd->floats_uncompressed_per_step(), 32 * 64 + 32 * 32 + 10 * 32 + 32 + 32 + 10);
  });
}

TEST(PowerSgd, RejectsBadOptionsAndAnUnattachedHook) {
  EXPECT_THROW(std::make_shared<PowerSgd>(PowerSgdOptions{.rank = 0}), ConfigError);
  EXPECT_THROW(std::make_shared<PowerSgd>(PowerSgdOptions{.rank = 1, .start_step = -1}), ConfigError);
  auto powersgd = std::make_shared<PowerSgd>();
  auto hook = powersgd->hook();
  paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& group) {
    at::Tensor buffer = at::zeros({4});
    try {
      hook(group, 0, buffer);
      ADD_FAILURE() << "an unattached hook ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attach"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace paratrain::ddp::testing

// ZeRO features beyond the plain oracle run: global gradient-norm clipping,
// gradient accumulation with no_sync(), equality with DDP, the memory the
// stages save, and the checkpoint view of the shards. Each compares against
// single-process training (or DDP) at the oracle tests' 1e-5 relative
// tolerance (see zero_oracle_test.cpp for why), with a control showing the
// feature changes the result.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <limits>
#include <map>
#include <mutex>

#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"
#include "tests/zero/zero_training.h"

namespace paratrain::zero::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 12;
// Gradient norms of these models start around 1-3 and shrink to ~0.3-1:
// 0.2 keeps clipping active in every step (checked below).
constexpr double kMaxNorm = 0.2;

Problem problem() { return ddp::testing::make_problem(kSteps, kGlobalBatch, /*seed=*/7); }

ZeroRun zero_run(int stage, int world) {
  ZeroRun run;
  run.world = world;
  run.zero.stage = stage;
  run.zero.buckets.first_bucket_cap_bytes = 256;
  run.zero.buckets.bucket_cap_bytes = 2048;
  return run;
}

class ZeroStageTest : public ::testing::TestWithParam<int> {};

// Clipping by the norm reduced over the dp group equals unsharded clipping
// with torch::nn::utils::clip_grad_norm_ in one process, and returns the same
// norm. Control: the same run without clipping is far from the clipped oracle.
TEST_P(ZeroStageTest, GlobalNormClippingMatchesSingleProcessClipping) {
  const int stage = GetParam();
  const Problem p = problem();
  Training training{.model = ModelKind::kMlp, .optim = Optim::kSgd, .clip = kMaxNorm};
  std::vector<double> oracle_norms;
  const Snapshot oracle = train_oracle(training, p, &oracle_norms);
  for (double norm : oracle_norms) ASSERT_GT(norm, kMaxNorm) << "clipping must be active in every step";

  const ZeroResult clipped = train_zero(training, zero_run(stage, 3), p);
  for (std::size_t r = 0; r < clipped.params.size(); ++r) {
    EXPECT_LE(ddp::testing::max_relative_diff(clipped.params[r], oracle), kTolerance) << "rank " << r;
  }
  ASSERT_EQ(clipped.norms.size(), oracle_norms.size());
  for (std::size_t s = 0; s < oracle_norms.size(); ++s) {
    EXPECT_NEAR(clipped.norms[s], oracle_norms[s], kTolerance * oracle_norms[s]) << "step " << s;
  }

  training.clip = 0;
  const ZeroResult unclipped = train_zero(training, zero_run(stage, 3), p);
  EXPECT_GT(ddp::testing::max_relative_diff(unclipped.params[0], oracle), 1e-3);
}

// The infinity norm (max |g|) is reduced with MAX instead of SUM.
TEST_P(ZeroStageTest, InfinityNormClippingMatchesSingleProcessClipping) {
  const int stage = GetParam();
  const Problem p = problem();
  Training training{.model = ModelKind::kCnn,
                    .optim = Optim::kSgd,
                    .clip = 0.05,
                    .norm_type = std::numeric_limits<double>::infinity()};
  std::vector<double> oracle_norms;
  const Snapshot oracle = train_oracle(training, p, &oracle_norms);
  ASSERT_GT(oracle_norms.front(), training.clip) << "clipping must be active";
  const ZeroResult clipped = train_zero(training, zero_run(stage, 2), p);
  EXPECT_LE(ddp::testing::max_relative_diff(clipped.params[0], oracle), kTolerance);
  for (std::size_t s = 0; s < oracle_norms.size(); ++s) {
    EXPECT_NEAR(clipped.norms.at(s), oracle_norms[s], kTolerance * oracle_norms[s]) << "step " << s;
  }
  training.clip = 0;
  const ZeroResult unclipped = train_zero(training, zero_run(stage, 2), p);
  EXPECT_GT(ddp::testing::max_relative_diff(unclipped.params[0], oracle), 1e-3);
}

// k micro-batches under no_sync() (the last one synchronizes) equal one batch
// k times larger: the oracle's full global batch.
TEST_P(ZeroStageTest, NoSyncAccumulationMatchesOneLargerBatch) {
  const int stage = GetParam();
  const Problem p = problem();
  const Training training{.model = ModelKind::kCnn, .optim = Optim::kAdam};
  const Snapshot oracle = train_oracle(training, p);
  for (auto [world, k] : {std::pair{2, 3}, std::pair{3, 2}}) {
    ZeroRun run = zero_run(stage, world);
    run.accumulate = k;
    const ZeroResult result = train_zero(training, run, p);
    EXPECT_LE(ddp::testing::max_relative_diff(result.params[0], oracle), kTolerance)
        << world << " ranks, " << k << " micro-batches";
  }
}

// ZeRO changes where the optimizer runs, not the training: equal to DDP.
TEST_P(ZeroStageTest, MatchesDistributedDataParallel) {
  const int stage = GetParam();
  const Problem p = problem();
  for (ModelKind model : {ModelKind::kMlp, ModelKind::kCnn}) {
    ddp::testing::RankRun ddp_run;
    ddp_run.model = model;
    ddp_run.world = 4;
    ddp_run.sgd = sgd_config();
    const std::vector<Snapshot> ddp = ddp::testing::train_ranks(ddp_run, p);
    const ZeroResult zero = train_zero({.model = model, .optim = Optim::kSgd}, zero_run(stage, 4), p);
    EXPECT_LE(ddp::testing::max_relative_diff(zero.params[0], ddp[0]), kTolerance)
        << ddp::testing::to_string(model);
  }
}

// Memory: optimizer state exists only for this rank's shard, and the shards
// of all ranks add up to the model exactly once (up to padding). Per rank,
// fp32 Adam, exactly up to padding: stage 1 holds 4 Psi (full parameters) +
// 4 Psi (full averaged .grad, which the shard gradients alias: no copy) +
// 8 Psi / N (moments), its persistent buckets counted apart; stage 2 holds no
// full-size gradient and no bucket buffer between steps: 4 Psi + 4 Psi / N
// (gradient shard) + 8 Psi / N. The exact equalities are the controls: a
// shard-gradient copy (stage 1) or a surviving full .grad / bucket (stage 2)
// breaks them; and stage 1 stays far above stage 2.
TEST_P(ZeroStageTest, OptimizerStateAndGradientsAreSharded) {
  const int stage = GetParam();
  const int world = 4;
  const Problem p = ddp::testing::make_problem(/*steps=*/2, kGlobalBatch, 7);
  const ZeroResult result = train_zero({.model = ModelKind::kMlp, .optim = Optim::kAdam}, zero_run(stage, world), p);

  auto model = ddp::testing::make_model(ModelKind::kMlp, 1);
  int64_t numel = 0;
  for (const auto& t : model->parameters()) numel += t.numel();
  const int64_t full_bytes = numel * 4;
  // The paper's stage-2 model states for fp32 Adam (K = 8 bytes of moments).
  const double stage2_bytes = full_bytes + (4.0 + 8.0) * numel / world;
  const double stage1_bytes = 2.0 * full_bytes + 8.0 * numel / world;

  int64_t shard_total = 0;
  for (int r = 0; r < world; ++r) {
    shard_total += result.shard_numel[r];
    const ModelStateBytes& s = result.state[r];
    // Adam: exp_avg and exp_avg_sq per element of the pieces (float32).
    EXPECT_EQ(s.optimizer_state, 2 * 4 * result.shard_numel[r]) << "rank " << r;
    EXPECT_LT(s.optimizer_state, 2 * full_bytes / world + 2 * 4 * 64) << "rank " << r;
    EXPECT_EQ(s.params, full_bytes) << "the optimizer's pieces alias the full parameters: no second copy";
    ASSERT_EQ(result.bucket_numel[r] % world, 0);
    if (stage == 1) {
      EXPECT_EQ(s.grads, full_bytes) << "stage 1: the full gradients only; the shard gradients alias them";
      EXPECT_EQ(s.comm_buffers, 4 * result.bucket_numel[r]) << "stage 1's buckets persist (write-back)";
      EXPECT_EQ(s.total(), 2 * full_bytes + 8 * result.shard_numel[r]) << "rank " << r;
      EXPECT_NEAR(static_cast<double>(s.total()), stage1_bytes, 0.05 * stage1_bytes) << "rank " << r;
      EXPECT_GT(static_cast<double>(s.total()), 1.2 * stage2_bytes) << "control: stage 1 is far above stage 2";
    } else {
      EXPECT_EQ(s.grads, 4 * result.bucket_numel[r] / world) << "stage 2 keeps only its gradient shard";
      EXPECT_EQ(s.comm_buffers, 0) << "stage 2's bucket buffers must not outlive the step";
      // Exact, padding included: the shard of every padded bucket, moments per piece.
      EXPECT_EQ(s.total(), full_bytes + 4 * result.bucket_numel[r] / world + 8 * result.shard_numel[r]);
      EXPECT_NEAR(static_cast<double>(s.total()), stage2_bytes, 0.05 * stage2_bytes) << "rank " << r;
    }
  }
  EXPECT_EQ(shard_total, numel) << "the pieces of all ranks tile every parameter exactly once";
}

// Setting every .grad to None after the step (LibTorch 2.x's default
// zero_grad(), and module-level zero_grad(set_to_none)) instead of zeroing in
// place: the next backward makes new .grad tensors, and the shard gradients
// must follow them (stage 1 re-points its aliases, stage 2 its shards).
// Oracle at 1e-5. Control: the in-place run is the same training, so the
// check is that both match; a stale alias would step on old gradients.
TEST_P(ZeroStageTest, GradientsSetToNoneBetweenStepsMatchOracle) {
  const int stage = GetParam();
  const Problem p = problem();
  const Training training{.model = ModelKind::kMlp, .optim = Optim::kAdam};
  const Snapshot oracle = train_oracle(training, p);
  ZeroRun run = zero_run(stage, 2);
  run.set_grads_to_none = true;
  const ZeroResult result = train_zero(training, run, p);
  for (std::size_t r = 0; r < result.params.size(); ++r) {
    EXPECT_LE(ddp::testing::max_relative_diff(result.params[r], oracle), kTolerance) << "rank " << r;
  }
  run.skip_gather = true;  // control: the comparison can fail
  EXPECT_GT(ddp::testing::max_relative_diff(train_zero(training, run, p).params[0], oracle), 1e-3);
}

// Checkpoint view: the slots of all ranks tile every parameter, and
// gather_parameters() after writing values into the pieces (as a loader does)
// rebuilds the full parameters on every rank.
TEST_P(ZeroStageTest, ParameterSlotsRoundTripThroughGather) {
  const int stage = GetParam();
  const int world = 3;
  std::mutex mu;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;  // name -> (offset, numel)
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& group) {
    auto model = ddp::testing::make_model(ModelKind::kCnn, 5);
    ZeroDataParallel zero(model, group, zero_run(stage, world).zero);
    const auto slots = zero.optimizer_param_slots();
    ASSERT_EQ(slots.size(), zero.optimizer_params().size());
    std::map<std::string, at::Tensor> params;
    for (const auto& item : model->named_parameters()) params[item.key()] = item.value().detach().clone();
    for (const auto& [piece, slot] : slots) {
      const at::Tensor& full = params.at(slot.name);
      EXPECT_EQ(slot.global_shape, full.sizes().vec());
      EXPECT_TRUE(torch::equal(slot.local, full.reshape({-1}).narrow(0, slot.flat_offset, slot.local.numel())));
      EXPECT_TRUE(piece.is_alias_of(slot.local)) << "the slot must alias the optimizer param";
      {
        std::lock_guard<std::mutex> lock(mu);
        ranges[slot.name].emplace_back(slot.flat_offset, slot.local.numel());
      }
      // A loader writes global values: element i of a tensor gets i.
      torch::NoGradGuard no_grad;
      slot.local.copy_(torch::arange(slot.flat_offset, slot.flat_offset + slot.local.numel(), torch::kFloat));
    }
    zero.gather_parameters();
    for (const auto& item : model->named_parameters()) {
      const at::Tensor expected = torch::arange(item.value().numel(), torch::kFloat).view(item.value().sizes());
      EXPECT_TRUE(torch::equal(item.value(), expected)) << item.key() << " on rank " << group.rank();
    }
  });
  auto model = ddp::testing::make_model(ModelKind::kCnn, 5);
  for (const auto& item : model->named_parameters()) {
    auto r = ranges[item.key()];
    std::sort(r.begin(), r.end());
    int64_t next = 0;
    for (auto [offset, n] : r) {
      EXPECT_EQ(offset, next) << item.key();
      next = offset + n;
    }
    EXPECT_EQ(next, item.value().numel()) << item.key();
  }
}

// ZeRO-Offload (ZeroOptions::offload): the optimizer's copy of each piece in
// host memory changes where the step runs, not its result. On CPU tensors
// the kernels are the same, so bitwise the run without offload, with Adam and
// clipping (the clipped gradients are the host copies then).
TEST_P(ZeroStageTest, OffloadedOptimizerEqualsTheUnoffloadedRunBitwise) {
  const int stage = GetParam();
  const Problem p = problem();
  Training training{.model = ModelKind::kMlp, .optim = Optim::kAdam, .clip = kMaxNorm};
  ZeroRun plain = zero_run(stage, 2);
  ZeroRun offloaded = plain;
  offloaded.zero.offload = true;
  const ZeroResult a = train_zero(training, plain, p);
  const ZeroResult b = train_zero(training, offloaded, p);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (std::size_t r = 0; r < a.params.size(); ++r)
    EXPECT_EQ(ddp::testing::max_relative_diff(b.params[r], a.params[r]), 0.0) << "rank " << r;
  ASSERT_EQ(a.norms.size(), b.norms.size());
  for (std::size_t s = 0; s < a.norms.size(); ++s) EXPECT_EQ(a.norms[s], b.norms[s]) << "step " << s;
}

// With offload the optimizer params are copies, not the pieces: what a
// checkpoint loader writes into the slots (the pieces of the full
// parameters) reaches them through after_load(), as the strategies' and
// load_checkpoint's after_load() call it. Control: before it they differ.
TEST_P(ZeroStageTest, OffloadedCopiesFollowWhatALoaderWrites) {
  const int stage = GetParam();
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = ddp::testing::make_model(ModelKind::kMlp, 5);
    ZeroOptions options = zero_run(stage, 2).zero;
    options.offload = true;
    ZeroDataParallel zero(model, group, options);
    for (const auto& [piece, slot] : zero.optimizer_param_slots()) {
      EXPECT_FALSE(piece.is_alias_of(slot.local)) << slot.name;
      EXPECT_TRUE(torch::equal(piece, slot.local)) << slot.name;
      torch::NoGradGuard no_grad;
      slot.local.copy_(torch::arange(slot.flat_offset, slot.flat_offset + slot.local.numel(), torch::kFloat));
      EXPECT_FALSE(torch::equal(piece, slot.local)) << slot.name;
    }
    zero.after_load();
    for (const auto& [piece, slot] : zero.optimizer_param_slots())
      EXPECT_TRUE(torch::equal(piece, slot.local)) << slot.name << " on rank " << group.rank();
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroStageTest, ::testing::Values(1, 2),
                         [](const auto& info) { return "Stage" + std::to_string(info.param); });

// How the gradients travel: stage 1 all-reduces every bucket (DDP's traffic),
// stage 2 issues no all-reduce at all (its buckets are reduce-scattered), and
// its first bucket is launched before backward ends, i.e. overlapped with it.
TEST_P(ZeroStageTest, GradientsTravelByTheStagesCollectiveDuringBackward) {
  const int stage = GetParam();
  const Problem p = ddp::testing::make_problem(/*steps=*/3, kGlobalBatch, 7);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& inner) {
    ddp::testing::CountingGroup group(inner);
    auto model = ddp::testing::make_model(ModelKind::kMlp, 1);
    ZeroDataParallel zero(model, group, zero_run(stage, 2).zero);
    auto opt = make_optimizer(Optim::kSgd, zero.optimizer_params());
    const std::size_t buckets = zero.layout().num_groups();
    ASSERT_GE(buckets, 3u) << "the test needs several buckets";
    const int before = group.all_reduces();
    for (int step = 0; step < p.steps; ++step) {
      zero.prepare_forward();
      const at::Tensor x = ddp::testing::shard(p.batch_inputs(step), group.rank(), 2);
      const at::Tensor y = ddp::testing::shard(p.batch_targets(step), group.rank(), 2);
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      const ddp::StepStats stats = zero.reducer().last_step();
      EXPECT_LT(stats.buckets.front().launched_ms, stats.backward_ms) << "first bucket launched in backward";
      zero.step(*opt);
    }
    const int per_step = stage == 1 ? static_cast<int>(buckets) : 0;
    EXPECT_EQ(group.all_reduces() - before, p.steps * per_step);
  });
}

// A step needs a synchronized backward: stepping inside no_sync() would apply
// stale shard gradients.
TEST(ZeroStep, RefusesToStepWithoutASynchronizedBackward) {
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = ddp::testing::make_model(ModelKind::kMlp, 1);
    ZeroOptions options;
    options.stage = 2;
    ZeroDataParallel zero(model, group, options);
    auto opt = make_optimizer(Optim::kSgd, zero.optimizer_params());
    auto guard = zero.no_sync();
    zero.prepare_forward();
    model->forward(torch::randn({2, 1, 8, 8})).sum().backward();
    EXPECT_THROW(zero.step(*opt), Error);
  });
}

TEST(ZeroOptions, RejectsStagesThisEngineDoesNotRun) {
  paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& group) {
    auto model = ddp::testing::make_model(ModelKind::kMlp, 1);
    for (int stage : {0, 3}) {
      ZeroOptions options;
      options.stage = stage;
      EXPECT_THROW({ ZeroDataParallel zero(model, group, options); }, ConfigError) << "stage " << stage;
    }
  });
}

}  // namespace
}  // namespace paratrain::zero::testing

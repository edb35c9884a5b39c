// Every strategy through the whole Trainer (config -> mesh -> registry ->
// strategy -> sharded checkpoints) against the single-process oracle, and
// checkpoints re-cut across world sizes and stages. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

TrainConfig small_config(const std::string& dir, const std::string& optimizer) {
  TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 11;
  c.run.log_every = 0;
  c.model.kind = "mlp";
  c.model.hidden = {24, 16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 96;
  c.data.synthetic_image_size = 6;
  c.data.global_batch_size = 24;  // divides over 1, 2, 3 and 4 ranks
  c.optimizer.kind = optimizer;
  c.optimizer.lr = optimizer == "sgd" ? 0.05 : 0.003;
  c.train.epochs = 1;
  c.train.max_steps = 12;
  c.train.eval_every_epochs = 0;
  c.zero.unit_min_params = 200;  // several FSDP units even for this tiny MLP
  return c;
}

// Trains `cfg` on `world` thread-ranks; returns rank 0's full parameters and
// checks that every rank holds the same ones.
Params train(const TrainConfig& cfg, int world) {
  std::vector<Params> per_rank(world);
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    per_rank[g.rank()] = t.full_parameters();
  });
  for (int r = 1; r < world; ++r) {
    for (size_t i = 0; i < per_rank[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(per_rank[0][i].second, per_rank[r][i].second))
          << "rank " << r << " differs from rank 0 on " << per_rank[0][i].first;
    }
  }
  return per_rank[0];
}

// max over tensors of max|a - b| / max|b|.
double relative_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

// Float32 sums in another order (per-rank means, then a reduction) differ
// by a few ulps per step; 12 steps of Adam or momentum SGD keep that far
// below 1e-5 relative. Without any gradient exchange the same runs differ by
// more than 1e-3 (asserted below), so the tolerance tells them apart.
constexpr double kTolerance = 1e-5;

class StrategyOracle : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(StrategyOracle, TwoAndThreeRanksEqualOneProcess) {
  const auto [stage, optimizer] = GetParam();
  auto dir = paratrain::testing::temp_dir("strategies");
  auto single_cfg = small_config(dir + "/single", optimizer);
  single_cfg.ddp.mode = "none";
  const Params single = train(single_cfg, 1);
  for (int world : {2, 3}) {
    auto cfg = small_config(dir + "/w" + std::to_string(world), optimizer);
    cfg.zero.stage = stage;
    const double diff = relative_diff(train(cfg, world), single);
    EXPECT_LT(diff, kTolerance) << "zero.stage " << stage << " " << optimizer << " on " << world << " ranks";
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, StrategyOracle,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values("sgd", "adam")));

TEST(StrategyOracle, NegativeControlLocalTrainingIsFarFromTheOracle) {
  auto dir = paratrain::testing::temp_dir("strategies_neg");
  auto single_cfg = small_config(dir + "/single", "adam");
  single_cfg.ddp.mode = "none";
  const Params single = train(single_cfg, 1);
  // One rank alone on half of each global batch: what any strategy without
  // its gradient exchange computes.
  auto alone_cfg = small_config(dir + "/alone", "adam");
  alone_cfg.ddp.mode = "none";
  alone_cfg.data.global_batch_size = 12;
  EXPECT_GT(relative_diff(train(alone_cfg, 1), single), 1e-3);
}

// Save at 4 ranks under ZeRO-3, resume at 2 ranks under ZeRO-1 and at one
// process under DDP: each continued run equals the uninterrupted one.
TEST(ReshardingCheckpoints, Stage3AtFourRanksResumesAtTwoRanksStage1AndOneProcess) {
  auto dir = paratrain::testing::temp_dir("reshard");
  auto full_cfg = small_config(dir + "/full", "adam");
  full_cfg.train.max_steps = 12;
  full_cfg.ddp.mode = "none";
  const Params uninterrupted = train(full_cfg, 1);

  auto first = small_config(dir + "/split", "adam");
  first.zero.stage = 3;
  first.train.max_steps = 6;
  train(first, 4);
  const auto ckpt = std::filesystem::path(dir) / "split" / "t" / "version_0" / "checkpoints" / "step_00000006";
  ASSERT_TRUE(std::filesystem::exists(ckpt / "index.json"));

  auto stage1 = small_config(dir + "/stage1", "adam");
  stage1.zero.stage = 1;
  stage1.train.resume = ckpt.string();
  EXPECT_LT(relative_diff(train(stage1, 2), uninterrupted), kTolerance);

  auto single = small_config(dir + "/one", "adam");
  single.ddp.mode = "none";
  single.train.resume = ckpt.string();
  EXPECT_LT(relative_diff(train(single, 1), uninterrupted), kTolerance);
}

TEST(TrainerInputs, GlobalBatchMustDivideOverDataParallelRanks) {
  auto dir = paratrain::testing::temp_dir("gbs");
  auto cfg = small_config(dir, "sgd");
  cfg.data.global_batch_size = 25;
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    try {
      Trainer t(cfg, g);
      FAIL() << "expected ConfigError";
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("data.global_batch_size = 25"), std::string::npos) << e.what();
    }
  });
}

TEST(TrainerInputs, ABatchLargerThanTheDatasetIsAnError) {
  auto dir = paratrain::testing::temp_dir("bigbatch");
  auto cfg = small_config(dir, "sgd");
  cfg.data.global_batch_size = 0;
  cfg.data.batch_size = 1000;  // > 480 items
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    EXPECT_THROW(Trainer(cfg, g), paratrain::ConfigError);
  });
}

TEST(TrainerInputs, DivergingLossStopsTheRunNamingTheStep) {
  auto dir = paratrain::testing::temp_dir("diverge");
  auto cfg = small_config(dir, "sgd");
  cfg.optimizer.lr = 1e30;
  cfg.run.log_every = 1;
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    try {
      t.fit();
      FAIL() << "expected the run to stop";
    } catch (const paratrain::Error& e) {
      EXPECT_NE(std::string(e.what()).find("by step"), std::string::npos) << e.what();
    }
  });
  // Nothing was checkpointed for the diverged state.
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "t" / "version_0" / "checkpoints" / "step_00000012"));
}

TEST(TrainerCheckpoints, KeepCheckpointsPrunesOldOnes) {
  auto dir = paratrain::testing::temp_dir("keep");
  auto cfg = small_config(dir, "sgd");
  cfg.train.checkpoint_every_steps = 2;
  cfg.train.keep_checkpoints = 2;
  train(cfg, 2);
  std::vector<std::string> left;
  for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir) / "t" / "version_0" / "checkpoints"))
    left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000010", "step_00000012"}));
}

}  // namespace

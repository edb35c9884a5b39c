// Gradient accumulation through the Trainer (train.accumulate = k): k
// micro-batches per optimizer step, the first k-1 without gradient exchange,
// must equal one process stepping once on the k-times larger batch, under
// every data-parallel strategy and the pipeline; the partial group at an
// epoch's end is dropped; a resumed run continues at a step boundary.
// Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using paratrain::train::TrainResult;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

// 480 synthetic items; momentum SGD, whose update is proportional to the
// gradient's scale, so a sum of micro-batch means (instead of their mean)
// would show as a 4x step.
TrainConfig small_config(const std::string& dir, int64_t per_rank_batch, int64_t accumulate) {
  TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 5;
  c.run.log_every = 0;
  c.model.kind = "mlp";
  c.model.hidden = {24, 16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 48;
  c.data.synthetic_image_size = 6;
  c.data.batch_size = per_rank_batch;
  c.train.accumulate = accumulate;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.train.epochs = 1;
  c.train.max_steps = 6;
  c.train.eval_every_epochs = 0;
  c.zero.unit_min_params = 200;  // several FSDP units
  return c;
}

// Trains on `world` thread-ranks; rank 0's full parameters (all ranks are
// checked equal) and its result.
std::pair<Params, TrainResult> train(const TrainConfig& cfg, int world) {
  std::vector<Params> per_rank(world);
  TrainResult result;
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    auto r = t.fit();
    per_rank[g.rank()] = t.full_parameters();
    if (g.rank() == 0) result = r;
  });
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < per_rank[0].size(); ++i)
      EXPECT_TRUE(torch::equal(per_rank[0][i].second, per_rank[r][i].second))
          << "rank " << r << " differs on " << per_rank[0][i].first;
  return {per_rank[0], result};
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

// The oracle: one process, no accumulation, the whole global batch per step.
Params oracle(const std::string& dir, int64_t global_batch, int64_t epochs, int64_t max_steps) {
  auto cfg = small_config(dir, global_batch, 1);
  cfg.ddp.mode = "none";
  cfg.train.epochs = epochs;
  cfg.train.max_steps = max_steps;
  return train(cfg, 1).first;
}

// Float32 sums in another order (micro-batch means summed, then reduced
// over ranks, vs one mean over the global batch) differ by a few ulps per
// step; 6 steps of momentum SGD keep that far below 1e-5 relative. The
// negative controls below are more than 1e-3 away.
constexpr double kTolerance = 1e-5;

class AccumulationOracle : public ::testing::TestWithParam<int> {};

// 2 ranks x 4 micro-batches of 3 = one step on 24 examples.
TEST_P(AccumulationOracle, FourMicroBatchesOnTwoRanksEqualOneProcessOnTheFourTimesBatch) {
  const int stage = GetParam();
  auto dir = paratrain::testing::temp_dir("accumulate");
  const Params single = oracle(dir + "/single", 24, 1, 6);
  auto cfg = small_config(dir + "/acc", 3, 4);
  cfg.zero.stage = stage;
  const auto [params, result] = train(cfg, 2);
  EXPECT_EQ(result.global_batch, 24);
  EXPECT_EQ(result.steps, 6);
  const double diff = relative_diff(params, single);
  RecordProperty("max_relative_diff", std::to_string(diff));
  EXPECT_LT(diff, kTolerance) << "zero.stage " << stage;
}

INSTANTIATE_TEST_SUITE_P(Stages, AccumulationOracle, ::testing::Values(0, 1, 2, 3));

// One process accumulating (ddp.mode = "none"), and the naive DDP twin.
TEST(Accumulation, OneProcessAndNaiveDdpEqualTheOracle) {
  auto dir = paratrain::testing::temp_dir("accumulate_modes");
  const Params single = oracle(dir + "/single", 24, 1, 6);
  auto alone = small_config(dir + "/alone", 6, 4);
  alone.ddp.mode = "none";
  EXPECT_LT(relative_diff(train(alone, 1).first, single), kTolerance);
  auto naive = small_config(dir + "/naive", 3, 4);
  naive.ddp.mode = "naive";
  EXPECT_LT(relative_diff(train(naive, 2).first, single), kTolerance);
}

// Pipeline steps accumulate too: 2 stages, 2 pipeline micro-batches per
// forward_backward, 4 of those per optimizer step.
TEST(Accumulation, PipelineEqualsTheOracle) {
  auto dir = paratrain::testing::temp_dir("accumulate_pp");
  const Params single = oracle(dir + "/single", 24, 1, 6);
  auto cfg = small_config(dir + "/pp", 6, 4);
  cfg.parallel.pp = 2;
  cfg.pipeline.microbatches = 2;
  cfg.pipeline.trace_steps = 0;
  const double diff = relative_diff(train(cfg, 2).first, single);
  RecordProperty("max_relative_diff", std::to_string(diff));
  EXPECT_LT(diff, kTolerance);
}

// The checks above can fail: one micro-batch per step (accumulation
// ignored), or the micro-batch losses summed instead of averaged (a 4x
// gradient: the oracle at 4x the rate), are far from the oracle.
TEST(Accumulation, NegativeControlsAreFarFromTheOracle) {
  auto dir = paratrain::testing::temp_dir("accumulate_neg");
  const Params single = oracle(dir + "/single", 24, 1, 6);
  const double ignored = relative_diff(oracle(dir + "/small", 6, 1, 6), single);
  auto summed_cfg = small_config(dir + "/summed", 24, 1);
  summed_cfg.ddp.mode = "none";
  summed_cfg.optimizer.lr *= 4;
  const double summed = relative_diff(train(summed_cfg, 1).first, single);
  RecordProperty("ignored_diff", std::to_string(ignored));
  RecordProperty("summed_diff", std::to_string(summed));
  EXPECT_GT(ignored, 1e-3);
  EXPECT_GT(summed, 1e-3);
}

// 240 items per rank in micro-batches of 3 = 80 per epoch: 26 steps of 3,
// the last 2 micro-batches dropped, as one process at batch 18 drops its
// last 12 items (the same ones). Two epochs, no max_steps.
TEST(Accumulation, AnEpochsPartialStepIsDropped) {
  auto dir = paratrain::testing::temp_dir("accumulate_epoch");
  const Params single = oracle(dir + "/single", 18, 2, 0);
  auto cfg = small_config(dir + "/acc", 3, 3);
  cfg.train.epochs = 2;
  cfg.train.max_steps = 0;
  const auto [params, result] = train(cfg, 2);
  EXPECT_EQ(result.steps, 2 * 26);
  EXPECT_EQ(result.epochs_completed, 2);
  EXPECT_EQ(result.global_batch, 18);
  const double diff = relative_diff(params, single);
  RecordProperty("max_relative_diff", std::to_string(diff));
  std::printf("accumulation over two epochs (52 steps) vs one process: %.2e\n", diff);
  // 52 steps instead of 6: float32 differences grow with the steps (measured
  // below 5e-7 here: the margin to 5e-5 covers other CPUs' BLAS, issue 23).
  EXPECT_LT(diff, 5e-5);
}

// Checkpoints fall on step boundaries: stopping after 4 steps and resuming
// to 8 equals 8 steps in one go.
TEST(Accumulation, ResumedRunEqualsUninterrupted) {
  auto dir = paratrain::testing::temp_dir("accumulate_resume");
  auto full = small_config(dir + "/full", 3, 3);
  full.train.max_steps = 8;
  const Params uninterrupted = train(full, 2).first;

  auto first = small_config(dir + "/split", 3, 3);
  first.train.max_steps = 4;
  train(first, 2);
  const auto ckpt = std::filesystem::path(dir) / "split" / "t" / "version_0" / "checkpoints" / "step_00000004";
  ASSERT_TRUE(std::filesystem::exists(ckpt / "index.json"));
  auto second = small_config(dir + "/split", 3, 3);
  second.train.max_steps = 8;
  second.train.resume = "auto";
  const auto [params, result] = train(second, 2);
  EXPECT_EQ(result.start_step, 4);
  EXPECT_EQ(result.steps, 8);
  EXPECT_LT(relative_diff(params, uninterrupted), 1e-6);
}

}  // namespace

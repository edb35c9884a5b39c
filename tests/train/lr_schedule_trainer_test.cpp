// The [lr] schedule through the Trainer: the rate of every optimizer step,
// as metrics.jsonl logs it and as the optimizer holds it, equals the
// closed-form formulas written out here (linear / sqrt batch scaling, warmup
// in steps or epochs, cosine and step decay), and the rate is what the
// optimizer applies. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;

TrainConfig small_config(const std::string& dir) {
  TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 3;
  c.run.log_every = 1;  // one metrics line per step
  c.model.kind = "mlp";
  c.model.hidden = {16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 48;
  c.data.synthetic_image_size = 4;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.train.epochs = 2;
  c.train.eval_every_epochs = 0;
  return c;
}

// step -> "lr" of the train lines in <run>/metrics.jsonl.
std::map<int64_t, double> logged_rates(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "t" / "version_0" / "metrics.jsonl");
  std::map<int64_t, double> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.at("kind") == "train") out[j.at("step").get<int64_t>()] = j.at("lr").get<double>();
  }
  return out;
}

// Trains `cfg` on `world` ranks; returns the optimizer's rate after fit.
double train(const TrainConfig& cfg, int world) {
  double rate = -1;
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    if (g.rank() == 0) rate = t.optimizer().param_groups().at(0).options().get_lr();
  });
  return rate;
}

// Linear scaling x2 (global batch 24 = 2 ranks x 6 x accumulate 2, tuned at
// 12), 3 warmup steps from a quarter of the peak, cosine to 0.01 at step 10.
TEST(LrScheduleTrainer, LinearScalingWarmupAndCosineFollowTheFormulas) {
  auto dir = paratrain::testing::temp_dir("lr_cosine");
  auto cfg = small_config(dir);
  cfg.data.batch_size = 6;
  cfg.train.accumulate = 2;
  cfg.train.max_steps = 10;
  cfg.lr.base_batch = 12;
  cfg.lr.scaling = "linear";
  cfg.lr.warmup_steps = 3;
  cfg.lr.warmup_start_factor = 0.25;
  cfg.lr.decay = "cosine";
  cfg.lr.min_lr = 0.01;
  const double final_rate = train(cfg, 2);

  const double peak = 0.05 * 24.0 / 12.0;
  auto expected = [&](int64_t t) {  // the rate of 0-based step t
    if (t < 3) return peak * (0.25 + 0.75 * static_cast<double>(t) / 3.0);
    return 0.01 + (peak - 0.01) * 0.5 * (1 + std::cos(std::numbers::pi * static_cast<double>(t - 3) / 7.0));
  };
  const auto logged = logged_rates(dir);
  ASSERT_EQ(logged.size(), 10u);
  for (const auto& [step, rate] : logged) EXPECT_NEAR(rate, expected(step - 1), 1e-12) << "step " << step;
  EXPECT_NEAR(logged.at(1), 0.025, 1e-12);  // spelled out: a quarter of 0.1
  EXPECT_NEAR(logged.at(4), peak, 1e-12);   // warmup ends at the peak
  EXPECT_NEAR(final_rate, expected(9), 1e-12);
}

// Square-root scaling (x2 for a 4x batch), warmup_epochs and step_epochs
// converted with 20 steps per epoch (480 items / 24): 5 warmup steps, the
// rate halved every 10 steps, across the epoch boundary.
TEST(LrScheduleTrainer, SqrtScalingAndEpochKeysFollowTheFormulas) {
  auto dir = paratrain::testing::temp_dir("lr_step");
  auto cfg = small_config(dir);
  cfg.data.batch_size = 24;
  cfg.ddp.mode = "none";
  cfg.train.max_steps = 25;
  cfg.lr.base_batch = 6;
  cfg.lr.scaling = "sqrt";
  cfg.lr.warmup_epochs = 0.25;
  cfg.lr.warmup_start_factor = 0.5;
  cfg.lr.decay = "step";
  cfg.lr.step_epochs = 0.5;
  cfg.lr.gamma = 0.5;
  train(cfg, 1);

  const double peak = 0.05 * 2.0;
  auto expected = [&](int64_t t) {
    if (t < 5) return peak * (0.5 + 0.5 * static_cast<double>(t) / 5.0);
    return peak * std::pow(0.5, static_cast<double>(t / 10));
  };
  const auto logged = logged_rates(dir);
  ASSERT_EQ(logged.size(), 25u);
  for (const auto& [step, rate] : logged) EXPECT_NEAR(rate, expected(step - 1), 1e-12) << "step " << step;
  EXPECT_NEAR(logged.at(25), 0.025, 1e-12);  // step 24: two halvings
}

// The rate is applied, not only logged: plain SGD at rate 0 (the first
// warmup step from factor 0) leaves the weights exactly as initialised; the
// same step at the configured rate moves them.
TEST(LrScheduleTrainer, TheOptimizerStepsAtTheScheduledRate) {
  auto dir = paratrain::testing::temp_dir("lr_applied");
  for (int64_t warmup : {2, 0}) {
    auto cfg = small_config(dir + "/w" + std::to_string(warmup));
    cfg.data.batch_size = 24;
    cfg.ddp.mode = "none";
    cfg.optimizer.momentum = 0;
    cfg.train.max_steps = 1;
    cfg.lr.warmup_steps = warmup;
    paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
      Trainer t(cfg, g);
      const auto before = t.full_parameters();
      t.fit();
      const auto after = t.full_parameters();
      double moved = 0;
      for (size_t i = 0; i < before.size(); ++i)
        moved = std::max(moved, (after[i].second - before[i].second).abs().max().item<double>());
      if (warmup > 0) {
        EXPECT_EQ(moved, 0.0);
      } else {
        EXPECT_GT(moved, 1e-4);
      }
    });
  }
}

// Cosine decay needs a run longer than its warmup: the error names the keys.
TEST(LrScheduleTrainer, CosineShorterThanWarmupIsAConfigError) {
  auto dir = paratrain::testing::temp_dir("lr_short");
  auto cfg = small_config(dir);
  cfg.data.batch_size = 24;
  cfg.ddp.mode = "none";
  cfg.train.max_steps = 4;
  cfg.lr.warmup_steps = 4;
  cfg.lr.decay = "cosine";
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    try {
      Trainer t(cfg, g);
      FAIL() << "expected ConfigError";
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("lr.warmup_steps"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("train.max_steps"), std::string::npos) << e.what();
    }
  });
}

}  // namespace

// Trainer callbacks: early stopping and best-checkpoint tracking on scripted
// metrics, the Trainer's hooks in order (a user callback that stops the run),
// the best checkpoint of a real run, and the progress bar's line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/train/callbacks.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/run/progress.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_run.h"

namespace {

namespace fs = std::filesystem;
using namespace paratrain::train;

EvalInfo eval_at(int64_t epoch, double value, const std::string& metric = "test_loss") {
  return EvalInfo{.step = 10 * (epoch + 1), .epoch = epoch, .metrics = {{metric, value}}};
}

TEST(EarlyStopping, StopsAfterPatienceEvaluationsWithoutImprovement) {
  // Losses by epoch: best at epoch 1 (0.5); 0.6, 0.55 do not improve.
  EarlyStopping stop("test_loss", "auto", /*patience=*/2);
  const double losses[] = {0.9, 0.5, 0.6, 0.55, 0.1};
  int64_t stopped_after = -1;
  for (int64_t e = 0; e < 5 && stopped_after < 0; ++e) {
    stop.on_validation_end(eval_at(e, losses[e]));
    if (stop.should_stop()) stopped_after = e;
  }
  EXPECT_EQ(stopped_after, 3);
  EXPECT_EQ(stop.stopped_epoch(), 3);

  // max mode and min_delta: +0.001 is not an improvement over 0.8 with min_delta 0.01.
  EarlyStopping acc("test_accuracy", "auto", 1, 0.01);
  acc.on_validation_end(eval_at(0, 0.8, "test_accuracy"));
  EXPECT_FALSE(acc.should_stop());
  acc.on_validation_end(eval_at(1, 0.801, "test_accuracy"));
  EXPECT_TRUE(acc.should_stop());

  // A metric the run does not log is named.
  EarlyStopping wrong("perplexity", "min", 1);
  try {
    wrong.on_validation_end(eval_at(0, 1.0));
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("train.monitor = \"perplexity\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_loss"), std::string::npos) << e.what();
  }
}

TEST(BestCheckpoint, PointsAtTheArgminOrArgmax) {
  for (const std::string mode : {"min", "max"}) {
    const auto dir = fs::path(paratrain::testing::temp_dir("best_" + mode));
    BestCheckpoint best("test_loss", mode);
    best.on_fit_start(FitInfo{.run_dir = dir, .is_main = true});
    const double values[] = {0.7, 0.3, 0.9, 0.4};
    for (int64_t e = 0; e < 4; ++e) {
      const auto ckpt = dir / "checkpoints" / fmt::format("step_{:08}", 10 * (e + 1));
      fs::create_directories(ckpt);
      best.on_validation_end(eval_at(e, values[e]));
      best.on_checkpoint(10 * (e + 1), ckpt);
    }
    const int64_t expected = mode == "min" ? 20 : 30;  // argmin 0.3 at epoch 1, argmax 0.9 at epoch 2
    EXPECT_EQ(best.best_step(), expected) << mode;
    auto linked = best_checkpoint(dir);
    ASSERT_TRUE(linked.has_value()) << mode;
    EXPECT_EQ(linked->filename(), fmt::format("step_{:08}", expected));
    std::ifstream in(dir / "checkpoints" / "best.json");
    const auto record = nlohmann::json::parse(in);
    EXPECT_EQ(record["step"], expected);
    EXPECT_EQ(record["value"], mode == "min" ? 0.3 : 0.9);
  }
}

TrainConfig tiny_config(const std::string& dir) {
  auto c = paratrain::testing::tiny_run_config(dir, "cb", /*epochs=*/5, /*log_every=*/2);
  c.run.seed = 5;
  return c;
}

// Records the hooks in order; asks to stop after the evaluation of `stop_epoch`.
struct Recorder : Callback {
  int64_t stop_epoch;
  std::vector<std::string> calls;
  bool stop = false;
  explicit Recorder(int64_t e) : stop_epoch(e) {}
  void on_fit_start(const FitInfo& f) override { calls.push_back(fmt::format("start {}", f.total_steps)); }
  void on_train_epoch_end(int64_t e) override { calls.push_back(fmt::format("epoch_end {}", e)); }
  void on_validation_end(const EvalInfo& e) override {
    calls.push_back(fmt::format("eval {}", e.epoch));
    stop = e.epoch == stop_epoch;
  }
  void on_checkpoint(int64_t step, const fs::path&) override { calls.push_back(fmt::format("ckpt {}", step)); }
  void on_fit_end(int64_t steps) override { calls.push_back(fmt::format("end {}", steps)); }
  bool should_stop() const override { return stop; }
};

TEST(TrainerCallbacks, HooksRunInOrderAndAStopEndsTheRunOnEveryRank) {
  const auto dir = paratrain::testing::temp_dir("cb_order");
  const auto c = tiny_config(dir);
  std::vector<std::shared_ptr<Recorder>> recorders(2);
  std::vector<TrainResult> results(2);
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(c, g);
    recorders[g.rank()] = std::make_shared<Recorder>(/*stop_epoch=*/1);
    t.add_callback(recorders[g.rank()]);
    results[g.rank()] = t.fit();
  });
  const std::vector<std::string> expected = {"start 20", "epoch_end 0", "eval 0", "ckpt 4",
                                             "epoch_end 1", "eval 1", "ckpt 8", "end 8"};
  EXPECT_EQ(recorders[0]->calls, expected);
  EXPECT_EQ(recorders[1]->calls, expected);
  EXPECT_TRUE(results[0].stopped_early);
  EXPECT_EQ(results[0].steps, 8);  // 2 of 5 epochs
  EXPECT_EQ(results[0].epochs_completed, 2);
}

// A real run with train.monitor: checkpoints/best is the checkpoint of the
// best test accuracy in metrics.jsonl, and train.keep_checkpoints spares it.
TEST(TrainerCallbacks, BestCheckpointOfARealRunSurvivesPruning) {
  const auto dir = paratrain::testing::temp_dir("cb_best");
  auto c = tiny_config(dir);
  c.optimizer.lr = 0.5;  // noisy enough that the last epoch is not always the best
  c.train.monitor = "test_accuracy";
  c.train.keep_checkpoints = 1;
  TrainResult result;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(c, g);
    result = t.fit();
  });
  double best = -1;
  int64_t best_step = -1;
  std::ifstream in(result.run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto row = nlohmann::json::parse(line);
    if (row["kind"] == "eval" && row["test_accuracy"].get<double>() > best) {
      best = row["test_accuracy"].get<double>();
      best_step = row["step"].get<int64_t>();
    }
  }
  auto linked = best_checkpoint(result.run_dir);
  ASSERT_TRUE(linked.has_value());
  EXPECT_EQ(linked->filename(), fmt::format("step_{:08}", best_step));
  EXPECT_TRUE(fs::exists(*linked / "index.json"));
  EXPECT_TRUE(fs::exists(result.last_checkpoint / "index.json"));  // the newest is kept too
}

TEST(ProgressBar, RendersEpochBarRateEtaAndLoss) {
  StepInfo s{.step = 30, .total_steps = 100, .epoch = 1, .epochs = 3, .batch = 15, .batches = 30,
             .samples_per_s = 1520.4, .eta_s = 12};
  EXPECT_EQ(render_progress(s, 0.43219, 10), "epoch 2/3 [#####-----] 15/30  50% 1520 samples/s ETA 12s loss 0.4322");
  EXPECT_EQ(render_progress(s, std::nan(""), 4), "epoch 2/3 [##--] 15/30  50% 1520 samples/s ETA 12s");
  LogConfig off;
  off.progress = "off";
  EXPECT_FALSE(progress_bar_wanted(off, 0));
  LogConfig on;
  on.progress = "on";
  EXPECT_TRUE(progress_bar_wanted(on, 0));
  EXPECT_FALSE(progress_bar_wanted(on, 1));  // only rank 0 draws
}

}  // namespace

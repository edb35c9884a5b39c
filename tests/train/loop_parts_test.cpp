// The training loop's parts on their own (paratrain/train/loop/): the loss
// window's reduction over ranks and its divergence check, the cadence of
// evaluations and of dynamic windows, and, through tiny real runs, the
// checkpoint policy's cadence (periodic, epoch ends, a resume that does not
// rewrite its start), the order of asynchronous commits, and a run stopped
// by a diverged loss.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/loop/batch_schedule.h"
#include "paratrain/train/loop/eval_policy.h"
#include "paratrain/train/loop/loss_window.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_run.h"

namespace {

namespace fs = std::filesystem;
using namespace paratrain::train;
using paratrain::comm::ProcessGroup;
using std::chrono::seconds;

// Rank 2 is a parameter server: it trains nothing and its loss must not count.
TEST(LossWindow, AveragesTheRanksThatTrainAndKeepsOwnLinesOutOfTheReduce) {
  std::vector<double> first(3), second(3), own_line(3);
  paratrain::testing::run_ranks(3, [&](ProcessGroup& g) {
    LossWindow losses(/*computes=*/g.rank() != 2, seconds(30), /*start_step=*/0);
    const std::vector<std::vector<double>> steps = {{1, 3}, {4}, {100}};
    for (double l : steps[g.rank()]) losses.add(l);
    first[g.rank()] = losses.reduce(g, 2);
    losses.add(g.rank() == 0 ? 5 : 7);
    if (g.rank() == 0) own_line[0] = losses.take_own_line();  // a mid-window line: no collective
    second[g.rank()] = losses.reduce(g, 3);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_DOUBLE_EQ(first[r], (2.0 + 4.0) / 2) << "rank " << r;
    EXPECT_DOUBLE_EQ(second[r], (5.0 + 7.0) / 2) << "rank " << r;
  }
  EXPECT_DOUBLE_EQ(own_line[0], 5.0);
}

TEST(LossWindow, ANonFiniteMeanStopsEveryRankNamingTheSteps) {
  std::vector<std::string> errors(2);
  paratrain::testing::run_ranks(2, [&](ProcessGroup& g) {
    LossWindow losses(true, seconds(30), /*start_step=*/2);
    losses.add(0.5);
    losses.add(g.rank() == 1 ? std::numeric_limits<double>::quiet_NaN() : 0.5);
    try {
      losses.reduce(g, 4);
    } catch (const paratrain::Error& e) {
      errors[g.rank()] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("training diverged"), std::string::npos) << e;
    EXPECT_NE(e.find("mean over steps 3..4"), std::string::npos) << e;
  }
}

TEST(EvalPolicy, EveryNEpochsAtTheirEndAndAtAStopInsideAnEpoch) {
  TrainConfig c;
  c.train.eval_every_epochs = 2;
  const EvalPolicy every_2(c);
  EXPECT_FALSE(every_2.due(0, /*epoch_done=*/true, /*stopping=*/false));
  EXPECT_TRUE(every_2.due(1, true, false));
  EXPECT_TRUE(every_2.due(1, true, true));
  EXPECT_FALSE(every_2.due(2, true, true));   // a stop at an epoch's end follows the cadence
  EXPECT_TRUE(every_2.due(2, false, true));   // train.max_steps inside epoch 3: its last state gets a figure
  EXPECT_FALSE(every_2.due(2, false, false));
  c.train.eval_every_epochs = 0;
  const EvalPolicy never(c);
  EXPECT_FALSE(never.due(1, true, false));
  EXPECT_FALSE(never.due(2, false, true));
}

// Windows of dynamic batches end where every rank meets anyway.
TEST(DynamicWindow, EndsAtTheEpochsEndACheckpointOrTheLastStep) {
  // first step in epoch, steps per epoch, steps taken, total steps, checkpoint every
  EXPECT_EQ(dynamic_window_steps(0, 10, 0, 30, 0), 10);   // the whole epoch
  EXPECT_EQ(dynamic_window_steps(4, 10, 14, 30, 0), 6);   // the rest of it
  EXPECT_EQ(dynamic_window_steps(0, 10, 20, 25, 0), 5);   // train.max_steps
  EXPECT_EQ(dynamic_window_steps(0, 10, 10, 30, 4), 2);   // to step 12, a checkpoint
  EXPECT_EQ(dynamic_window_steps(2, 10, 12, 30, 4), 4);   // 12 -> 16
  EXPECT_EQ(dynamic_window_steps(8, 10, 18, 30, 4), 2);   // the epoch ends at step 20, a checkpoint too
}

// The order of what the loop tells callbacks: "step N" after each optimizer
// step, "ckpt N" when checkpoint N is complete on disk.
struct Events : Callback {
  std::vector<std::string> seen;
  int64_t start_step = -1;
  void on_fit_start(const FitInfo& f) override { start_step = f.start_step; }
  void on_train_batch_end(const StepInfo& s) override { seen.push_back(fmt::format("step {}", s.step)); }
  void on_validation_end(const EvalInfo& e) override { seen.push_back(fmt::format("eval {}", e.epoch)); }
  void on_checkpoint(int64_t step, const fs::path& dir) override {
    EXPECT_TRUE(fs::exists(dir / "index.json")) << dir;  // told only once complete
    seen.push_back(fmt::format("ckpt {}", step));
  }
  std::vector<int64_t> checkpoints() const {
    std::vector<int64_t> out;
    for (const auto& e : seen) {
      if (e.rfind("ckpt ", 0) == 0) out.push_back(std::stoll(e.substr(5)));
    }
    return out;
  }
  // Index of `event` in seen, -1 when absent.
  int64_t at(const std::string& event) const {
    for (size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] == event) return static_cast<int64_t>(i);
    }
    return -1;
  }
};

// 128 items, batch 16, one rank: 8 steps an epoch.
TrainConfig checkpointed(const std::string& dir, bool async) {
  auto c = paratrain::testing::tiny_run_config(dir, "policy", /*epochs=*/2, /*log_every=*/4);
  c.train.checkpoint_every_steps = 3;
  c.train.async_checkpoint = async;
  return c;
}

std::shared_ptr<Events> fit_with_events(const TrainConfig& c) {
  auto events = std::make_shared<Events>();
  paratrain::testing::run_ranks(1, [&](ProcessGroup& g) {
    Trainer t(c, g);
    t.add_callback(events);
    t.fit();
  });
  return events;
}

TEST(CheckpointPolicy, SavesEveryNStepsAndAtEpochEndsOnceEach) {
  const auto dir = paratrain::testing::temp_dir("policy_sync");
  const auto events = fit_with_events(checkpointed(dir, /*async=*/false));
  EXPECT_EQ(events->checkpoints(), (std::vector<int64_t>{3, 6, 8, 9, 12, 15, 16}));
  // Synchronous: complete before the next step.
  for (int64_t s : {3, 6, 9, 12, 15}) EXPECT_EQ(events->at(fmt::format("ckpt {}", s)), events->at(fmt::format("step {}", s)) + 1);
  // An epoch's end: its evaluation first, then the checkpoint of its position.
  EXPECT_LT(events->at("eval 0"), events->at("ckpt 8"));
  EXPECT_GT(events->at("eval 0"), events->at("step 8"));

  // Resumed for a third epoch: the start is not saved again; the cadence goes on.
  auto more = checkpointed(dir, false);
  more.train.epochs = 3;
  more.train.resume = "auto";
  more.run.version = 0;
  const auto resumed = fit_with_events(more);
  EXPECT_EQ(resumed->start_step, 16);
  EXPECT_EQ(resumed->checkpoints(), (std::vector<int64_t>{18, 21, 24}));
  EXPECT_EQ(resumed->at("step 16"), -1);
  EXPECT_GE(resumed->at("step 17"), 0);
}

TEST(CheckpointPolicy, AnAsyncCheckpointIsCommittedWhenTheNextSaveOrTheEndWaitsForIt) {
  const auto dir = paratrain::testing::temp_dir("policy_async");
  const auto events = fit_with_events(checkpointed(dir, /*async=*/true));
  EXPECT_EQ(events->checkpoints(), (std::vector<int64_t>{3, 6, 8, 9, 12, 15, 16}));
  // Each is reported when the next save starts (it waits for the one in
  // flight): after that save's step, not after its own.
  const std::vector<int64_t> saves = {3, 6, 8, 9, 12, 15};
  for (size_t i = 0; i + 1 < saves.size(); ++i) {
    EXPECT_GT(events->at(fmt::format("ckpt {}", saves[i])), events->at(fmt::format("step {}", saves[i + 1])))
        << "checkpoint " << saves[i];
  }
  EXPECT_EQ(events->seen.back(), "ckpt 16");  // the last one at the end of fit
}

TEST(FitLoop, ADivergedLossStopsTheRunWithoutACheckpointOfIt) {
  const auto dir = paratrain::testing::temp_dir("policy_diverged");
  auto c = paratrain::testing::tiny_run_config(dir, "diverged", /*epochs=*/2, /*log_every=*/1);
  c.optimizer.lr = 1e30;
  c.train.checkpoint_every_steps = 1;
  std::string error;
  fs::path run_dir;
  paratrain::testing::run_ranks(1, [&](ProcessGroup& g) {
    Trainer t(c, g);
    run_dir = t.run_dir();
    try {
      t.fit();
    } catch (const paratrain::Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("training diverged"), std::string::npos) << error;
  std::ifstream status(run_dir / "run.json");
  EXPECT_EQ(nlohmann::json::parse(status)["status"], "failed");
  // The step whose loss was not finite was never saved (the check comes first).
  const auto diverged_at = std::stoll(error.substr(error.find("by step ") + 8));
  EXPECT_FALSE(fs::exists(run_dir / "checkpoints" / fmt::format("step_{:08}", diverged_at)));
}

}  // namespace

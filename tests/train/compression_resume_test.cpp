// Gradient compression state in the Trainer's sharded checkpoints, 2 ranks
// as threads: a run stopped at step 10 and resumed to 20 equals 20 steps in
// one go bitwise (the same data, the same sums, and the restored state make
// every later step identical). Negative controls: the same checkpoint with
// the state/ tensors removed from its index (as a checkpoint from before
// they were saved) resumes to a different model.
//
// PowerSGD (Note [PowerSGD state in checkpoints], data_parallel/ddp/
// powersgd_state.cpp): error feedback, Q and step count, with compression
// running before the stop (start_step 3, warm Q and errors to restore) and
// not yet (start_step 12: Q must still be drawn from the restored stream at
// step 12).
//
// The int8 wire (Note [Int8 wire state in checkpoints], data_parallel/ddp/
// int8_compression.cpp): both residuals under DDP, the phase-1 residual
// under ZeRO-2's reduce-scatter.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

namespace fs = std::filesystem;
using testing::Params;

TrainConfig powersgd_config(const std::string& dir, const std::string& name, int64_t start_step) {
  TrainConfig c = testing::mlp_oracle_config(dir, name, 0);
  c.optimizer.kind = "sgd";
  c.optimizer.momentum = 0.9;
  c.optimizer.lr = 0.05;
  c.ddp.compression = "powersgd";
  c.ddp.powersgd_rank = 1;  // low rank: large errors, so losing them shows
  c.ddp.powersgd_start_step = start_step;
  return c;
}

Params train_ranks(const TrainConfig& c) { return testing::train_ranks(c, 2); }

// `first` trained to step 10 at 2 ranks; its step-10 checkpoint.
fs::path stopped_at_10(TrainConfig first) {
  first.train.max_steps = 10;
  train_ranks(first);
  return fs::path(first.run.output_dir) / first.run.name / "version_0" / "checkpoints" / "step_00000010";
}

bool bitwise_equal(const Params& a, const Params& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || !torch::equal(a[i].second, b[i].second)) return false;
  return true;
}

// A copy of checkpoint `from` whose index no longer lists the state/ tensors.
fs::path without_strategy_state(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  nlohmann::json index;
  std::ifstream(to / "index.json") >> index;
  int removed = 0;
  for (auto it = index["tensors"].begin(); it != index["tensors"].end();) {
    if (it.key().starts_with("state/")) {
      it = index["tensors"].erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  EXPECT_GT(removed, 0) << "the checkpoint holds no compression state";
  std::ofstream(to / "index.json") << index.dump();
  return to;
}

TEST(PowerSgdResume, ResumedRunEqualsTheUninterruptedOneBitwise) {
  const auto dir = testing::temp_dir("powersgd_resume");
  for (int64_t start_step : {3, 12}) {
    const std::string tag = "_start" + std::to_string(start_step);
    const Params whole = train_ranks(powersgd_config(dir, "whole" + tag, start_step));

    const fs::path ckpt = stopped_at_10(powersgd_config(dir, "first" + tag, start_step));
    ASSERT_TRUE(fs::exists(ckpt / "index.json")) << ckpt;

    TrainConfig resumed = powersgd_config(dir, "resumed" + tag, start_step);
    resumed.train.resume = ckpt.string();
    const Params after_resume = train_ranks(resumed);
    EXPECT_TRUE(bitwise_equal(after_resume, whole))
        << "start_step " << start_step << ": max relative diff " << testing::relative_diff(after_resume, whole);

    if (start_step != 3) continue;
    TrainConfig stateless = powersgd_config(dir, "stateless" + tag, start_step);
    stateless.train.resume = without_strategy_state(ckpt, fs::path(dir) / "stripped").string();
    const double diff = testing::relative_diff(train_ranks(stateless), whole);
    RecordProperty("resume_without_powersgd_state_diff", std::to_string(diff));
    EXPECT_GT(diff, 1e-3) << "resuming without PowerSGD's state changed nothing: the check cannot fail";
  }
}

TrainConfig int8_config(const std::string& dir, const std::string& name, int64_t zero_stage) {
  TrainConfig c = testing::mlp_oracle_config(dir, name, zero_stage);
  c.optimizer.kind = "sgd";
  c.optimizer.momentum = 0.9;
  c.optimizer.lr = 0.05;
  c.ddp.compression = "int8";
  return c;
}

TEST(Int8WireResume, ResumedRunEqualsTheUninterruptedOneBitwise) {
  const auto dir = testing::temp_dir("int8_resume");
  for (int64_t stage : {0, 2}) {
    const std::string tag = "_zero" + std::to_string(stage);
    const Params whole = train_ranks(int8_config(dir, "whole" + tag, stage));

    const fs::path ckpt = stopped_at_10(int8_config(dir, "first" + tag, stage));
    ASSERT_TRUE(fs::exists(ckpt / "index.json")) << ckpt;

    TrainConfig resumed = int8_config(dir, "resumed" + tag, stage);
    resumed.train.resume = ckpt.string();
    const Params after_resume = train_ranks(resumed);
    EXPECT_TRUE(bitwise_equal(after_resume, whole))
        << "zero.stage " << stage << ": max relative diff " << testing::relative_diff(after_resume, whole);

    // At another world size (4 ranks): each rank's residuals restart, the
    // per-slice ones are re-cut; the run goes on from the step it was at.
    TrainConfig wider = int8_config(dir, "wider" + tag, stage);
    wider.train.resume = ckpt.string();
    const Params at_four = testing::train_ranks(wider, 4);
    const double wider_diff = testing::relative_diff(at_four, whole);
    RecordProperty("resume_at_4_ranks_diff" + tag, std::to_string(wider_diff));
    EXPECT_LT(wider_diff, 1e-2) << "zero.stage " << stage << ": 4 ranks after a 2-rank checkpoint";

    TrainConfig stateless = int8_config(dir, "stateless" + tag, stage);
    stateless.train.resume = without_strategy_state(ckpt, fs::path(dir) / ("stripped" + tag)).string();
    const double diff = testing::relative_diff(train_ranks(stateless), whole);
    RecordProperty("resume_without_int8_residuals_diff" + tag, std::to_string(diff));
    // Runs are deterministic: any difference is the residuals' doing.
    EXPECT_GT(diff, 0) << "resuming without the residuals changed nothing: the check cannot fail";
  }
}

}  // namespace
}  // namespace paratrain::train

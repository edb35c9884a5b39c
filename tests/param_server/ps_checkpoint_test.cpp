// Parameter-server runs in the sharded checkpoint format: each server writes
// its key ranges and its optimizer state, so a PS checkpoint consolidates to
// the single-process one, and a PS run resumes from it (at another server
// and worker count too) to end where one process trained straight through
// ends. Negative control: the same resume with the servers' optimizer state
// dropped lands far off, so the resume check needs that state restored.
// Ranks are threads.
#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>

#include <filesystem>

#include "paratrain/checkpoint/compare.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/trainer.h"
#include "tests/param_server/ps_training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

namespace fs = std::filesystem;
using testing::Params;
using testing::relative_diff;
using testing::small_config;
using testing::train;

// As in ps_oracle_test.cpp: sums in another order, a few ulps per step.
constexpr double kTolerance = 1e-5;

fs::path checkpoint_of(const std::string& dir, int step) {
  return fs::path(dir) / "t" / "version_0" / "checkpoints" / fmt::format("step_{:08d}", step);
}

TEST(PsCheckpoint, ConsolidatedPsCheckpointEqualsTheOneProcessCheckpoint) {
  auto dir = paratrain::testing::temp_dir("ps_consolidate");
  train(small_config(dir + "/single", "adam"), 1);
  auto cfg = small_config(dir + "/ps", "adam");
  cfg.ps.servers = 2;  // the parameters' key ranges are split over two files
  train(cfg, 5);
  const auto ps_ckpt = checkpoint_of(dir + "/ps", 20);
  ASSERT_TRUE(fs::exists(ps_ckpt / "index.json")) << ps_ckpt;
  checkpoint::consolidate_checkpoint(ps_ckpt, fs::path(dir) / "ps.safetensors");
  const auto report =
      checkpoint::compare_checkpoints(fs::path(dir) / "ps.safetensors", checkpoint_of(dir + "/single", 20), {kTolerance});
  EXPECT_TRUE(report.ok()) << report.format();
  // The servers' Adam moments are in the checkpoint too, under the same names
  // as one process's (looser: exp_avg_sq squares the few-ulp differences).
  checkpoint::CompareOptions optimizer_state{1e-4, "optimizer/"};
  const auto state =
      checkpoint::compare_checkpoints(fs::path(dir) / "ps.safetensors", checkpoint_of(dir + "/single", 20), optimizer_state);
  EXPECT_TRUE(state.ok()) << state.format();
}

TEST(PsCheckpoint, ResumedAtAnotherLayoutEqualsOneProcessAndNeedsTheServersOptimizerState) {
  auto dir = paratrain::testing::temp_dir("ps_resume");
  const Params single = train(small_config(dir + "/single", "adam"), 1);

  auto first = small_config(dir + "/first", "adam");
  first.ps.servers = 2;
  first.train.max_steps = 10;
  train(first, 4);  // 2 servers, 2 workers
  const auto ckpt = checkpoint_of(dir + "/first", 10);
  ASSERT_TRUE(fs::exists(ckpt / "index.json")) << ckpt;

  for (bool drop_state : {false, true}) {
    auto resumed = small_config(dir + (drop_state ? "/dropped" : "/resumed"), "adam");
    resumed.ps.servers = 1;  // 1 server, 3 workers: every range re-sharded
    resumed.train.resume = ckpt.string();
    const Params p = train(resumed, 4, [&](train::Trainer& t) {
      if (drop_state) t.optimizer().state().clear();  // only servers hold any
    });
    const double diff = relative_diff(p, single);
    RecordProperty(drop_state ? "dropped_state_diff" : "resume_diff", std::to_string(diff));
    if (drop_state) {
      EXPECT_GT(diff, 1e-3) << "dropping the servers' Adam state changed nothing: the check cannot fail";
    } else {
      EXPECT_LT(diff, kTolerance);
    }
  }
}

}  // namespace
}  // namespace paratrain::param_server

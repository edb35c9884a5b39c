// Note [Resuming at another world size] (resume_run.cpp): a checkpoint of a
// 1-rank run resumed mid-epoch on 2 ranks with the same per-rank batch (an
// elastic scale-up without elastic.keep_global_batch) continues the epoch
// at the samples the 1-rank run had trained, not at its batch count: with a
// batch count the 2-rank split would skip half of what remains (or, past
// the shorter epoch's end, fail to load).
//
// Oracle: the same checkpoint resumed on 1 rank with the 2 ranks' global
// batch (2 x 16): the same samples per step from the same position, so DDP
// equals it (float32 sums in another order: rtol 1e-5). Negative control:
// the step count of the epoch. 640 items: the 1-rank run stops after 10 of
// its 40 steps (160 samples); 480 remain = 15 steps of 32. Resuming by batch
// count would start the 2 ranks at their batch 10 of 20 and end the epoch
// after 20 steps, not 25.
#include <gtest/gtest.h>

#include <filesystem>

#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::mlp_oracle_config;
using paratrain::testing::one_process;
using paratrain::testing::Params;
using paratrain::testing::relative_diff;

TrainConfig per_rank_batch(const std::string& dir, const std::string& name, int64_t batch) {
  TrainConfig c = mlp_oracle_config(dir, name, 0);
  c.data.global_batch_size = 0;
  c.data.batch_size = batch;
  c.optimizer.kind = "sgd";
  c.optimizer.momentum = 0.9;
  c.train.max_steps = 0;  // the whole epoch
  return c;
}

// Copies the 1-rank run's step-10 checkpoint into a run of its own, so each
// resume starts from it with a fresh run folder.
std::string checkpoint_copy(const std::string& dir, const std::string& from, const std::string& to) {
  const auto src = std::filesystem::path(dir) / from / "version_0" / "checkpoints" / "step_00000010";
  const auto dst = std::filesystem::path(dir) / to / "step_00000010";
  std::filesystem::create_directories(dst.parent_path());
  std::filesystem::copy(src, dst, std::filesystem::copy_options::recursive);
  return dst.string();
}

TEST(ResumeWorldSize, ScaleUpContinuesTheEpochAtTheSamplesTrained) {
  const std::string dir = paratrain::testing::temp_dir("resume-world");
  TrainConfig first = per_rank_batch(dir, "one_rank", 16);
  first.train.max_steps = 10;
  one_process(first);

  TrainConfig two = per_rank_batch(dir, "two_ranks", 16);
  two.train.resume = checkpoint_copy(dir, "one_rank", "ckpt_two");
  Params two_params;
  TrainResult two_result;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    Trainer t(two, group);
    auto r = t.fit();
    auto p = t.full_parameters();
    if (group.rank() == 0) {
      two_params = std::move(p);
      two_result = r;
    }
  });

  TrainConfig oracle = per_rank_batch(dir, "oracle", 32);
  oracle.train.resume = checkpoint_copy(dir, "one_rank", "ckpt_oracle");
  const Params oracle_params = one_process(oracle);

  const double diff = relative_diff(two_params, oracle_params);
  std::printf("[ measured ] 1 -> 2 ranks resumed vs 1 rank at the global batch: %.3g; steps %lld\n", diff,
              static_cast<long long>(two_result.steps));
  EXPECT_EQ(two_result.start_step, 10);
  EXPECT_EQ(two_result.steps, 25) << "10 steps of 16 + the 480 remaining samples in steps of 32";
  EXPECT_LE(diff, 1e-5);
}

}  // namespace
}  // namespace paratrain::train

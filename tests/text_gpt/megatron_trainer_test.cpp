// The GPT through the Trainer under the megatron strategy (parallel.tp,
// parallel.cp, parallel.megatron_sp, composed with dp) equals one process
// training the same GPT on the same global batch: full parameters after 10
// AdamW steps, the evaluation loss, and the consolidated checkpoint. Also:
// every bad layout is a ConfigError naming its factors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "paratrain/core/error.h"
#include "paratrain/models/gpt.h"
#include "paratrain/checkpoint/compare.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/generate.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace paratrain::train {
namespace {
namespace fs = std::filesystem;

fs::path write_corpus(const fs::path& dir) { return paratrain::testing::write_word_corpus(dir, 777); }

constexpr int64_t kSteps = 10;

TrainConfig gpt_config(const std::string& out, const fs::path& corpus) {
  return paratrain::testing::tiny_gpt_config(out, corpus);
}

// AdamW is compared with one process at 6 steps, before float-order noise
// that AdamW magnifies in near-zero gradients can part the runs (issue 23).
constexpr int64_t kAdamSteps = 6;

TrainConfig adamw(TrainConfig c) {
  c.optimizer.kind = "adamw";
  c.optimizer.lr = 3e-3;
  c.optimizer.momentum = 0;
  c.train.max_steps = kAdamSteps;
  return c;
}

using paratrain::testing::max_rel_diff;
using paratrain::testing::run_training;
using paratrain::testing::RunOutput;

// Note [Adam amplifies rounding]
// Adam steps each element by lr * m / (sqrt(v) + eps): for an element whose
// gradient is near eps (1e-8) in size, a rounding difference of 1e-12 moves
// the step by ~1e-4 x lr. A GPT has such elements: the key third of
// qkv.bias (softmax ignores it, so its exact gradient is zero and its float
// gradient is pure rounding) and the weights of MLP units that GELU has
// switched off. Any change of summation order moves them: DDP on 2 ranks
// against one process differs by 4e-5 to 8e-5 of a tensor's scale after 10
// AdamW steps (printed by the test), at float32 rounding of the gradients.
// So under AdamW the bound is 1e-4 and the figure is printed next to DDP's;
// SGD, which puts every gradient linearly into the weights, carries the 1e-5
// oracle for every layout.
constexpr double kAdamTolerance = 1e-4;

// Note [Megatron oracle tolerance]
// The tensor-parallel sums (row-parallel outputs, the vocab-parallel
// softmax denominator, the clipping norm) and the cp/dp averages add the
// same float32 terms as one process in another order, so gradients differ by
// a few ulps; AdamW's division by sqrt(v) carries that into the weights, and
// 10 steps compound it. Measured under SGD: 3e-7 to 6e-7 relative for every
// layout (AdamW: Note [Adam amplifies rounding]). 1e-5 is the project's
// float32 oracle bound and far below the difference of a run that misses a
// reduction (the negative control: 0.1).
constexpr double kTolerance = 1e-5;

class MegatronTrainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(paratrain::testing::temp_dir("megatron_trainer"));
    corpus_ = new fs::path(write_corpus(fs::path(*dir_) / "text"));
    auto cfg = gpt_config(*dir_ + "/single", *corpus_);
    cfg.data.batch_size = 8;  // the global batch of every layout below
    single_ = new RunOutput(run_training(cfg, 1));
  }
  static void TearDownTestSuite() {
    delete single_;
    delete corpus_;
    delete dir_;
  }

  // Trains `layout` on dp * tp * cp ranks with the same global batch and
  // compares with the single process.
  static RunOutput check_layout(const std::string& name, int dp, int tp, int cp, bool sp) {
    auto cfg = gpt_config(*dir_ + "/" + name, *corpus_);
    cfg.parallel.tp = tp;
    cfg.parallel.cp = cp;
    cfg.parallel.megatron_sp = sp;
    cfg.data.batch_size = 8 / dp;
    const RunOutput multi = run_training(cfg, dp * tp * cp);
    const double diff = max_rel_diff(multi.params, single_->params);
    std::printf("[ %s ] dp %d x tp %d x cp %d%s vs 1 process: worst relative diff %.3g after %lld steps "
                "(tolerance %.0e)\n",
                name.c_str(), dp, tp, cp, sp ? " + megatron_sp" : "", diff, static_cast<long long>(kSteps),
                kTolerance);
    EXPECT_LE(diff, kTolerance);
    EXPECT_EQ(multi.result.steps, kSteps);
    EXPECT_EQ(multi.result.test.count, single_->result.test.count);
    EXPECT_NEAR(multi.result.test.loss, single_->result.test.loss, 1e-5 * single_->result.test.loss);
    return multi;
  }

  static std::string* dir_;
  static fs::path* corpus_;
  static RunOutput* single_;
};
std::string* MegatronTrainer::dir_ = nullptr;
fs::path* MegatronTrainer::corpus_ = nullptr;
RunOutput* MegatronTrainer::single_ = nullptr;

TEST_F(MegatronTrainer, TensorParallel2EqualsOneProcess) { check_layout("tp2", 1, 2, 1, false); }
TEST_F(MegatronTrainer, TensorParallel4EqualsOneProcess) { check_layout("tp4", 1, 4, 1, false); }
TEST_F(MegatronTrainer, ContextParallel2EqualsOneProcess) { check_layout("cp2", 1, 1, 2, false); }
TEST_F(MegatronTrainer, MegatronSequenceParallelEqualsOneProcess) { check_layout("tp2_sp", 1, 2, 1, true); }
TEST_F(MegatronTrainer, DataTimesTensorParallelEqualsOneProcess) { check_layout("dp2_tp2", 2, 2, 1, false); }
TEST_F(MegatronTrainer, TensorTimesContextParallelEqualsOneProcess) { check_layout("tp2_cp2", 1, 2, 2, false); }

TEST_F(MegatronTrainer, ConsolidatedCheckpointEqualsOneProcessAndGenerates) {
  // tp x cp with Megatron-SP: sharded rows (qkv's three parts), sharded
  // columns (row-parallel weights) and tensors replicated over tp and cp.
  const RunOutput multi = check_layout("tp2_cp2_sp", 1, 2, 2, true);
  ASSERT_FALSE(multi.result.last_checkpoint.empty());
  ASSERT_FALSE(single_->result.last_checkpoint.empty());
  const fs::path file = fs::path(*dir_) / "tp2_cp2_sp.safetensors";
  checkpoint::consolidate_checkpoint(multi.result.last_checkpoint, file);
  checkpoint::CompareOptions options;
  options.all = true;  // parameters, Adam's moments, the RNG state
  const checkpoint::CompareReport report = checkpoint::compare_checkpoints(file, single_->result.last_checkpoint, options);
  std::printf("%s\n", report.format().c_str());
  EXPECT_TRUE(report.ok());
  EXPECT_TRUE(report.only_in_a.empty());
  EXPECT_TRUE(report.only_in_b.empty());

  // The run's own (sharded) checkpoint loads into the plain GPT for sampling.
  auto config = gpt_config(*dir_ + "/tp2_cp2_sp", *corpus_);
  config.parallel.tp = 2;
  config.parallel.cp = 2;
  config.parallel.megatron_sp = true;
  auto model = load_model_for_inference(config, multi.result.last_checkpoint);
  SamplingOptions sampling;
  sampling.tokens = 20;
  sampling.seed = 1;
  EXPECT_EQ(generate(*model, config.model.seq_len, "the ", sampling).size(), 20u);
}

TEST_F(MegatronTrainer, ResumedRunEqualsOneProcess) {
  // Stopped after half the steps, resumed from its sharded checkpoint (model
  // shards and momentum through the slots' segments): the same weights as
  // one uninterrupted process.
  auto cfg = gpt_config(*dir_ + "/resumed", *corpus_);
  cfg.parallel.tp = 2;
  cfg.parallel.megatron_sp = true;
  cfg.train.max_steps = kSteps / 2;
  run_training(cfg, 2);
  cfg.train.max_steps = kSteps;
  cfg.train.resume = "auto";
  const RunOutput resumed = run_training(cfg, 2);
  EXPECT_EQ(resumed.result.steps, kSteps);  // counted from the start
  const double diff = max_rel_diff(resumed.params, single_->params);
  std::printf("[ resumed tp2_sp ] worst relative diff %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
}

TEST_F(MegatronTrainer, AdamWEqualsOneProcessAsCloselyAsDdp) {
  auto single_cfg = adamw(gpt_config(*dir_ + "/adam_single", *corpus_));
  const RunOutput single = run_training(single_cfg, 1);
  auto cfg = adamw(gpt_config(*dir_ + "/adam_tp2_cp2_sp", *corpus_));
  cfg.parallel.tp = 2;
  cfg.parallel.cp = 2;
  cfg.parallel.megatron_sp = true;
  const RunOutput multi = run_training(cfg, 4);
  auto ddp_cfg = adamw(gpt_config(*dir_ + "/adam_ddp", *corpus_));
  ddp_cfg.data.batch_size = 4;
  const RunOutput ddp = run_training(ddp_cfg, 2);
  const double diff = max_rel_diff(multi.params, single.params);
  std::printf("[ adamw tp2_cp2_sp ] worst relative diff %.3g after %lld steps (DDP on 2 ranks: %.3g; tolerance "
              "%.0e)\n",
              diff, static_cast<long long>(kAdamSteps), max_rel_diff(ddp.params, single.params), kAdamTolerance);
  EXPECT_LE(diff, kAdamTolerance);
  EXPECT_NEAR(multi.result.test.loss, single.result.test.loss, 1e-5 * single.result.test.loss);
}

TEST_F(MegatronTrainer, NegativeControlHalfBatchMissesByFar) {
  // One process on half the global batch (what a rank would train on if the
  // replicas' average were skipped) is far outside the tolerance: the
  // comparison above can fail.
  auto cfg = gpt_config(*dir_ + "/half", *corpus_);
  cfg.data.batch_size = 4;
  const double diff = max_rel_diff(run_training(cfg, 1).params, single_->params);
  std::printf("[ half batch ] worst relative diff %.3g\n", diff);
  EXPECT_GT(diff, 100 * kTolerance);
}

// Every bad layout: a ConfigError that names the factors involved.
void expect_config_error(const TrainConfig& cfg, int world, const std::vector<std::string>& fragments) {
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    try {
      Trainer t(cfg, g);
      ADD_FAILURE() << "no ConfigError";
    } catch (const ConfigError& e) {
      for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  });
}

TEST_F(MegatronTrainer, BadLayoutsAreConfigErrorsNamingEveryFactor) {
  auto base = gpt_config(*dir_ + "/bad", *corpus_);
  {
    auto c = base;
    c.parallel.tp = 2;
    c.parallel.cp = 2;
    c.parallel.dp = 2;
    expect_config_error(c, 2, {"dp(2)", "tp(2)", "pp(1)", "cp(2)", "world_size(2)"});
  }
  {
    auto c = base;
    c.model.heads = 2;
    c.model.d_model = 32;
    c.parallel.tp = 4;
    expect_config_error(c, 4, {"model.heads (2)", "parallel.tp (4)"});
  }
  {
    auto c = base;
    c.model.heads = 3;
    c.model.d_model = 48;
    c.parallel.tp = 3;
    expect_config_error(c, 3, {"vocabulary (256", "parallel.tp (3)"});
  }
  {
    auto c = base;
    c.model.seq_len = 15;
    c.parallel.cp = 2;
    expect_config_error(c, 2, {"model.seq_len (15)", "parallel.cp (2)"});
  }
  {
    auto c = base;
    c.model.seq_len = 12;
    c.parallel.cp = 2;
    c.parallel.tp = 4;
    c.parallel.megatron_sp = true;
    expect_config_error(c, 1, {"model.seq_len (12)", "parallel.cp (2)", "parallel.tp (4)"});
  }
  {
    auto c = base;
    c.parallel.megatron_sp = true;
    expect_config_error(c, 1, {"parallel.megatron_sp", "parallel.tp = 1"});
  }
  {
    auto c = base;
    c.parallel.pp = 2;
    c.parallel.tp = 2;
    c.parallel.megatron_sp = true;
    c.zero.stage = 2;  // stages and Megatron-SP compose, but not with ZeRO-2 (mesh4d_trainer_test.cpp)
    expect_config_error(c, 1, {"zero.stage = 2", "parallel.pp = 2", "parallel.megatron_sp = true", "parallel.tp = 2"});
  }
  {
    auto c = base;
    c.parallel.cp = 2;
    c.model.dropout = 0.1;
    expect_config_error(c, 1, {"model.dropout = 0.1", "parallel.cp = 2"});
  }
}

}  // namespace
}  // namespace paratrain::train

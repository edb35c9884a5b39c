// In-job recovery at its edges (train/recovery/in_job.h): elastic.keep_global_batch
// applied by the survivors, and a rank dying inside an evaluation or inside
// a synchronous checkpoint save. Ranks are threads with their own Gloo
// groups over one test-held store, as in in_job_test.cpp; a dying thread
// aborts its group and leaves, as a killed process's sockets close.
// With elastic.keep_global_batch the survivors' job is, step for step, the
// undisturbed job: the oracle is one process training with the same global
// batch throughout (Note [Keeping the global batch in the job] in
// train/recovery/in_job_batch.cpp).
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <csignal>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/rejoin.h"
#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/train/recovery/in_job_batch.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/elastic/in_job_support.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain {
namespace {

using testing::Params;

// Gloo sends with writev(), which raises SIGPIPE when a peer's socket is
// closed: a survivor writing to the dead rank would kill this whole test
// process (it did, once, in this suite). `paratrain train` ignores SIGPIPE with
// elastic.in_job for the same reason; so does this binary, for every test in
// it (in_job_test.cpp's too).
class IgnoreSigpipe : public ::testing::Environment {
 public:
  void SetUp() override { std::signal(SIGPIPE, SIG_IGN); }
};
[[maybe_unused]] ::testing::Environment* const ignore_sigpipe =
    ::testing::AddGlobalTestEnvironment(new IgnoreSigpipe);

constexpr int kWorld = 3;
constexpr int kDying = 2;
constexpr int64_t kDeath = 5;  // the dying rank completes this many steps

using testing::Died;

// Where a rank dies: after step `at` (before that step's checkpoint save,
// when one is due: the survivors then fail inside the save), or at the end
// of epoch `at` (before its evaluation: the survivors fail inside it).
class Die : public train::Callback {
 public:
  enum class When { kAfterStep, kAtEpochEnd };
  Die(comm::ProcessGroup& group, When when, int64_t at) : group_(group), when_(when), at_(at) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    if (when_ == When::kAfterStep && info.step == at_) die();
  }
  void on_train_epoch_end(int64_t epoch) override {
    if (when_ == When::kAtEpochEnd && epoch == at_) die();
  }

 private:
  [[noreturn]] void die() {
    group_.abort();
    throw Died();
  }
  comm::ProcessGroup& group_;
  When when_;
  int64_t at_;
};

// 576 items: whole global batches of 24 and 18 at 3 and 2 ranks.
train::TrainConfig config(const std::string& name, bool keep_global_batch, int64_t global_batch = 24,
                          int64_t accumulate = 1) {
  auto c = testing::mlp_oracle_config(testing::temp_dir(name), name, 0);
  c.data.synthetic_train_size = 576;
  c.data.global_batch_size = global_batch;
  c.data.prefetch = 0;
  c.train.accumulate = accumulate;
  c.optimizer.kind = "sgd";
  c.optimizer.momentum = 0.9;  // optimizer state the survivors carry over
  c.optimizer.lr = 0.05;
  c.train.max_steps = 20;
  c.world.timeout_s = 30;
  c.elastic.in_job = true;
  c.elastic.keep_global_batch = keep_global_batch;
  return c;
}

using testing::RankOutcome;

// Runs the job on kWorld threads; rank kDying dies as `when` and `at` say.
std::vector<RankOutcome> run_job(const train::TrainConfig& c, Die::When when, int64_t at) {
  return testing::run_job_with_death(c, kWorld, /*dying=*/-1, 0, c.elastic.in_job,
                                     [&](int rank, comm::ProcessGroup& group, train::Trainer& trainer) {
                                       if (rank == kDying) trainer.add_callback(std::make_shared<Die>(group, when, at));
                                     });
}

// The undisturbed job on one process: the same global batch throughout.
struct OneProcess {
  Params params;
  std::filesystem::path run_dir;
};
OneProcess one_process(train::TrainConfig c) {
  c.elastic.in_job = false;
  c.run.name += "_one_process";
  auto group = comm::make_gloo_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, {});
  train::Trainer trainer(c, *group);
  const auto r = trainer.fit();
  return {trainer.full_parameters(), r.run_dir};
}

std::vector<nlohmann::json> records(const std::filesystem::path& run_dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == kind) out.push_back(j);
  }
  return out;
}

void rethrow_survivor_errors(const std::vector<RankOutcome>& out) {
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == kDying) {
      ASSERT_TRUE(out[rank].error);
      EXPECT_THROW(std::rethrow_exception(out[rank].error), Died);
    } else if (out[rank].error) {
      try {
        std::rethrow_exception(out[rank].error);
      } catch (const std::exception& e) {
        FAIL() << "survivor " << rank << " failed: " << e.what();
      }
    }
  }
}

// float32 SGD: the DDP mean of per-rank means and the one-process mean sum
// in different orders (~1e-7 relative per step).
constexpr double kRtol = 1e-5;

double worst_survivor_diff(const std::vector<RankOutcome>& out, const Params& expected) {
  double worst = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == kDying || !out[rank].params) continue;
    worst = std::max(worst, testing::relative_diff(*out[rank].params, expected));
  }
  return worst;
}

// What every test here starts with: runs the job (rank kDying dies as `when`
// and `at` say), rethrows a survivor's error, checks the survivors equal
// `expected` (rtol kRtol, recorded as the test's relative_diff) and returns
// their outcomes with the run's recovery records.
struct Survivors {
  std::vector<RankOutcome> out;
  std::vector<nlohmann::json> recovery;
};
Survivors survivors_equal(const train::TrainConfig& c, Die::When when, int64_t at, const Params& expected) {
  Survivors s{run_job(c, when, at), {}};
  rethrow_survivor_errors(s.out);
  const double diff = worst_survivor_diff(s.out, expected);
  EXPECT_LT(diff, kRtol);
  ::testing::Test::RecordProperty("relative_diff", fmt::format("{:.3g}", diff));
  s.recovery = records(s.out[0].result.run_dir, "recovery");
  return s;
}

// 3 -> 2 ranks, per-rank batch 8 -> 12: the survivors equal one process
// that trained all 20 steps with the global batch of 24, under a warmup
// that spans the death and a cosine decay planned over the 20 steps.
TEST(InJobEdges, KeepGlobalBatchRaisesThePerRankBatchAndEqualsTheUndisturbedRun) {
  auto c = config("keep_batch", true);
  c.lr.warmup_steps = 8;
  c.lr.decay = "cosine";
  c.run.log_every = 1;
  const OneProcess expected = one_process(c);
  const auto [out, recovery] = survivors_equal(c, Die::When::kAfterStep, kDeath, expected.params);
  EXPECT_EQ(out[0].result.recoveries, 1);
  EXPECT_EQ(out[0].result.steps, 20);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["per_rank_batch"], 12);
  EXPECT_EQ(recovery[0]["old_per_rank_batch"], 8);
  EXPECT_EQ(recovery[0]["global_batch"], 24);
  EXPECT_EQ(recovery[0]["accumulate"], 1);
  EXPECT_EQ(recovery[0]["keep_global_batch"], true);
  // The LR schedule went on as planned (the rate of every step is the
  // undisturbed run's), and the sample counts count 24 per step.
  const auto train = records(out[0].result.run_dir, "train");
  const auto expected_train = records(expected.run_dir, "train");
  ASSERT_EQ(train.size(), 20u);
  ASSERT_EQ(expected_train.size(), 20u);
  for (std::size_t i = 0; i < train.size(); ++i) {
    EXPECT_EQ(train[i]["step"], expected_train[i]["step"]);
    EXPECT_DOUBLE_EQ(train[i]["lr"].get<double>(), expected_train[i]["lr"].get<double>()) << "step " << i + 1;
  }
  EXPECT_EQ(train.back()["samples"], 20 * 24);

  // Negative control: without the key the global batch shrinks to 16 and
  // the survivors end elsewhere.
  auto off = c;
  off.run.name = "keep_batch_off";
  off.elastic.keep_global_batch = false;
  const auto shrunk = run_job(off, Die::When::kAfterStep, kDeath);
  rethrow_survivor_errors(shrunk);
  const double off_diff = worst_survivor_diff(shrunk, expected.params);
  EXPECT_GT(off_diff, 1e-3);
  RecordProperty("without_keep_global_batch_relative_diff", fmt::format("{:.3g}", off_diff));
}

// Per-rank batch 3 x 2 micro-batches on 3 ranks (global 18): on 2 ranks 18
// does not split into 2 x 2 micro-batches, so train.accumulate goes 2 -> 3.
TEST(InJobEdges, KeepGlobalBatchRaisesAccumulationWhenThePerRankBatchDoesNotDivide) {
  const auto c = config("keep_batch_acc", true, /*global_batch=*/18, /*accumulate=*/2);
  const auto [out, recovery] = survivors_equal(c, Die::When::kAfterStep, kDeath, one_process(c).params);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["per_rank_batch"], 3);
  EXPECT_EQ(recovery[0]["accumulate"], 3);
  EXPECT_EQ(recovery[0]["old_accumulate"], 2);
  EXPECT_EQ(recovery[0]["global_batch"], 18);
}

// Rank 2 dies at the end of epoch 1, so the survivors' evaluation's
// all-reduce fails: they re-form and evaluate again over the whole test set,
// then train epoch 2. The evaluation record and the parameters are the
// undisturbed run's.
TEST(InJobEdges, ARankDyingInsideAnEvaluationIsRecoveredAndTheEvaluationRedone) {
  auto c = config("die_in_eval", true);
  c.train.epochs = 2;
  c.train.max_steps = 24 + 6;  // an epoch is 24 steps of 24
  c.train.eval_every_epochs = 1;
  const OneProcess expected = one_process(c);
  const auto [out, recovery] = survivors_equal(c, Die::When::kAtEpochEnd, 0, expected.params);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["phase"], "evaluation");
  const auto evals = records(out[0].result.run_dir, "eval");
  const auto expected_evals = records(expected.run_dir, "eval");
  ASSERT_EQ(evals.size(), 2u);
  ASSERT_EQ(expected_evals.size(), 2u);
  for (std::size_t i = 0; i < evals.size(); ++i) {
    EXPECT_EQ(evals[i]["epoch"], expected_evals[i]["epoch"]);
    EXPECT_NEAR(evals[i]["test_loss"].get<double>(), expected_evals[i]["test_loss"].get<double>(),
                kRtol * expected_evals[i]["test_loss"].get<double>());
    EXPECT_EQ(evals[i]["test_accuracy"], expected_evals[i]["test_accuracy"]);
  }
  EXPECT_EQ(out[0].result.test.count, c.data.synthetic_test_size);  // every test item, once

  // Without elastic.in_job the same death ends the survivors' run.
  auto off = c;
  off.run.name = "die_in_eval_off";
  off.elastic.in_job = false;
  const auto failed = run_job(off, Die::When::kAtEpochEnd, 0);
  for (int rank : {0, 1}) {
    ASSERT_TRUE(failed[rank].error) << "rank " << rank << " went on without in-job recovery";
    EXPECT_THROW(std::rethrow_exception(failed[rank].error), CommError);
  }
}

// Rank 2 dies right after step 5, when a checkpoint is due: the survivors
// fail inside the save (rank 0 has cleared the step's directory; no index).
// They re-form and save step 5 again at 2 ranks; it is a complete 2-rank
// checkpoint, and training goes on as the undisturbed run.
TEST(InJobEdges, ARankDyingInsideACheckpointSaveIsRecoveredAndTheSaveRedoneAtTheNewWorldSize) {
  auto c = config("die_in_save", true);
  c.train.checkpoint_every_steps = 5;
  const auto [out, recovery] = survivors_equal(c, Die::When::kAfterStep, kDeath, one_process(c).params);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["phase"], "checkpoint");
  EXPECT_EQ(recovery[0]["step"], kDeath);
  const auto step5 = out[0].result.run_dir / "checkpoints" / "step_00000005";
  const auto index = checkpoint::read_index(step5);
  EXPECT_EQ(index.world_size, 2);
  EXPECT_FALSE(std::filesystem::exists(step5 / "rank_2.safetensors"));
  // The redone checkpoint resumes: 4 more steps from it on 2 ranks equal
  // the undisturbed run of 9 steps.
  auto resumed = c;
  resumed.elastic.in_job = false;
  resumed.elastic.keep_global_batch = false;
  resumed.run.name = "die_in_save_resumed";
  resumed.train.resume = step5.string();
  resumed.train.max_steps = kDeath + 4;
  resumed.train.checkpoint_every_steps = 0;
  std::vector<Params> params(2);
  testing::run_ranks(2, [&](comm::ProcessGroup& group) { params[group.rank()] = testing::train_on(resumed, group); });
  auto nine = c;
  nine.train.max_steps = kDeath + 4;
  nine.train.checkpoint_every_steps = 0;
  nine.run.name = "die_in_save_nine";
  const double resumed_diff = testing::relative_diff(params[0], one_process(nine).params);
  EXPECT_LT(resumed_diff, kRtol);
  RecordProperty("resumed_relative_diff", fmt::format("{:.3g}", resumed_diff));
}

// ZeRO-2 (sharded: recovery rolls back to a checkpoint): rank 2 dies right
// after step 10, when a checkpoint is due, so the survivors fail inside that
// save. The save belongs to steps the rollback undoes: they drop it, roll
// back to the complete step-5 checkpoint and go on from there (the fit
// loop's RollbackCaught), saving step 10 again at 2 ranks when they reach it.
// With keep_global_batch the survivors' job is the undisturbed one, so the
// oracle is one process with the same global batch throughout.
TEST(InJobEdges, ARollbackCaughtInsideACheckpointSaveGoesOnFromTheRestoredCheckpoint) {
  auto c = config("rollback_in_save", true);
  c.zero.stage = 2;
  c.train.checkpoint_every_steps = 5;
  const auto [out, recovery] = survivors_equal(c, Die::When::kAfterStep, 10, one_process(c).params);
  ASSERT_EQ(recovery.size(), 1u);
  EXPECT_EQ(recovery[0]["phase"], "checkpoint");
  EXPECT_EQ(recovery[0]["step"], 10);
  EXPECT_EQ(recovery[0]["restored_step"], 5);
  EXPECT_EQ(recovery[0]["redo_step"], 6);
  const auto step10 = out[0].result.run_dir / "checkpoints" / "step_00000010";
  EXPECT_EQ(checkpoint::read_index(step10).world_size, 2);
  EXPECT_EQ(out[0].result.steps, c.train.max_steps);
}

TEST(InJobEdges, KeepGlobalBatchThatCannotBeKeptIsAConfigErrorNamingTheSizes) {
  // Global 20 (per-rank 4 x 5 ranks) over 3 ranks: neither 20 / 3 nor
  // 20 / (3 x 4) is whole.
  auto c = config("keep_batch_err", true, 20);
  try {
    train::batch_after_recovery(c, {4, 1, 20, {}}, 5, 3);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("elastic.keep_global_batch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("global batch 20"), std::string::npos) << e.what();
  }
  c.elastic.keep_global_batch = false;
  EXPECT_EQ(train::batch_after_recovery(c, {4, 1, 20, {}}, 5, 3).sizes.global, 12);
}

}  // namespace
}  // namespace paratrain

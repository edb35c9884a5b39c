// In-job recovery of the sharded strategies (elastic.in_job with zero.stage
// 1-3, train/recovery/in_job_rollback.h): rank 2 of 3 dies after step kDeath; the
// survivors roll back to the latest checkpoint (or the run's start) in the
// same processes and train on at world 2. They must end equal to the run a
// person would get by resuming from that checkpoint by hand on 2 ranks (or
// by starting afresh on 2 ranks): proof that the whole state came from the
// checkpoint, resharded, and nothing of the failed steps leaked.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/train/config/config.h"
#include "tests/elastic/in_job_support.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain {
namespace {

using testing::Params;
using testing::RankOutcome;

constexpr int kWorld = 3;
constexpr int64_t kPerRank = 8;
constexpr int kDying = 2;

struct Case {
  int64_t stage = 2;
  int64_t train_size = 576;  // 24 steps of 3 x 8 per epoch; 576 - 3*8*s splits evenly over 2
  int64_t epochs = 1;
  int64_t max_steps = 16;        // 0: train.epochs decide
  int64_t checkpoint_every = 4;  // train.checkpoint_every_steps
  int64_t death = 6;             // the dying rank completes this many steps
  int64_t restored = 4;          // the step the survivors must roll back to (0: the run's start)
  int64_t steps = 16;            // the steps the survivors end at
  int64_t corrupt = 0;           // > 0: rank 0 corrupts this step's checkpoint one step later
};

// Flips one byte of rank 0's shard of checkpoint step `step` after step
// step + 1: a checkpoint that looks complete but fails its checksum at load.
class CorruptCheckpoint : public train::Callback {
 public:
  CorruptCheckpoint(std::filesystem::path run_dir, int64_t step) : run_dir_(std::move(run_dir)), step_(step) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    if (info.step != step_ + 1 || done_) return;
    done_ = true;
    const auto file = checkpoint::checkpoint_dir(run_dir_, step_) / "rank_0.safetensors";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f) << file;
    f.seekg(-4, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    f.seekp(-4, std::ios::end);
    f.write(&byte, 1);
  }

 private:
  std::filesystem::path run_dir_;
  int64_t step_;
  bool done_ = false;
};

train::TrainConfig config(const std::string& dir, const Case& k) {
  auto c = testing::mlp_oracle_config(dir, fmt::format("zero{}", k.stage), k.stage);
  c.data.synthetic_train_size = k.train_size;
  c.data.global_batch_size = kPerRank * kWorld;
  c.data.prefetch = 0;
  c.optimizer.kind = "sgd";
  c.optimizer.momentum = 0.9;  // the optimizer state a dead rank's shard holds
  c.optimizer.lr = 0.05;
  c.train.epochs = k.epochs;
  c.train.max_steps = k.max_steps;
  c.train.checkpoint_every_steps = k.checkpoint_every;
  c.world.timeout_s = 30;
  c.elastic.in_job = true;
  return c;
}

// The same run on `world` thread ranks without in-job recovery, resumed
// from `checkpoint` (empty: from the start), the per-rank batch kept.
Params by_hand(const train::TrainConfig& c, int world, const std::string& name, const std::string& checkpoint) {
  auto hand = c;
  hand.elastic.in_job = false;
  hand.run.name = name;
  hand.train.resume = checkpoint;
  hand.data.global_batch_size = world * kPerRank;
  std::vector<Params> params(world);
  testing::run_ranks(world, [&](comm::ProcessGroup& group) { params[group.rank()] = testing::train_on(hand, group); });
  return params[0];
}

void check_case(const Case& k) {
  const auto dir = testing::temp_dir(fmt::format("in_job_zero{}", k.stage));
  const auto c = config(dir, k);
  const auto out = testing::run_job_with_death(c, kWorld, kDying, k.death, true, [&](int rank, comm::ProcessGroup&, train::Trainer& t) {
    if (rank == 0 && k.corrupt > 0) t.add_callback(std::make_shared<CorruptCheckpoint>(t.run_dir(), k.corrupt));
  });
  ASSERT_TRUE(out[kDying].error);
  EXPECT_THROW(std::rethrow_exception(out[kDying].error), testing::Died);
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == kDying || !out[rank].error) continue;
    try {
      std::rethrow_exception(out[rank].error);
    } catch (const std::exception& e) {
      FAIL() << "survivor " << rank << " failed: " << e.what();
    }
  }
  const auto run_dir = out[0].result.run_dir;
  // Read before the comparison runs add their own checkpoints elsewhere.
  const std::string checkpoint =
      k.restored > 0 ? checkpoint::checkpoint_dir(run_dir, k.restored).string() : std::string();
  const Params expected = by_hand(c, kWorld - 1, "by_hand", checkpoint);
  for (int rank : {0, 1}) {
    EXPECT_EQ(out[rank].result.recoveries, 1);
    EXPECT_EQ(out[rank].result.world_size, kWorld - 1);
    EXPECT_EQ(out[rank].result.steps, k.steps);
    // The same steps over the same samples at the same world size; only
    // float32 summation order could differ (in practice it does not).
    const double diff = testing::relative_diff(*out[rank].params, expected);
    EXPECT_LT(diff, 1e-5) << "rank " << rank;
    ::testing::Test::RecordProperty(fmt::format("rank{}_relative_diff", rank), fmt::format("{:.3g}", diff));
  }
  // Negative control: the run undisturbed on 3 ranks ends elsewhere, so the
  // comparison above can fail.
  auto undisturbed = c;
  undisturbed.elastic.in_job = false;
  undisturbed.run.name = "undisturbed";
  std::vector<Params> three(kWorld);
  testing::run_ranks(kWorld, [&](comm::ProcessGroup& g) { three[g.rank()] = testing::train_on(undisturbed, g); });
  const double undisturbed_diff = testing::relative_diff(three[0], expected);
  EXPECT_GT(undisturbed_diff, 1e-3);
  ::testing::Test::RecordProperty("undisturbed_relative_diff", fmt::format("{:.3g}", undisturbed_diff));

  const auto records = testing::recovery_records(run_dir / "metrics.jsonl");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["dead_ranks"], nlohmann::json::array({kDying}));
  EXPECT_EQ(records[0]["world_size"], kWorld - 1);
  EXPECT_EQ(records[0]["step"], k.death);
  EXPECT_EQ(records[0]["restored_step"], k.restored);
  EXPECT_EQ(records[0]["redo_step"], k.restored + 1);
  if (k.corrupt > 0) {  // moved aside for a post-mortem; the redone step saved it anew
    auto aside = checkpoint::checkpoint_dir(run_dir, k.corrupt);
    aside += ".unreadable";
    EXPECT_TRUE(std::filesystem::exists(aside)) << aside;
    EXPECT_TRUE(std::filesystem::exists(checkpoint::checkpoint_dir(run_dir, k.corrupt) / "index.json"));
  }
  const std::string restored = records[0]["restored"];
  EXPECT_NE(restored.find(k.restored > 0 ? fmt::format("rolled back to checkpoint step {}", k.restored)
                                         : std::string("rolled back to the run's start")),
            std::string::npos)
      << restored;
}

// Mid-epoch: the checkpoint at step 4 (3 ranks), death after step 6; the
// survivors redo steps 5-6 at world 2 over the rest of the epoch.
TEST(InJobZero, Zero2SurvivorsEqualTheRunResumedByHandFromTheLatestCheckpointOnTwoRanks) {
  check_case(Case{.stage = 2});
}

// FSDP, whose parameters are shards too; the latest checkpoint is the one
// at the end of epoch 1 (step 6 of 6 at 3 ranks), the death in epoch 2.
TEST(InJobZero, FsdpSurvivorsEqualTheRunResumedByHandFromTheEndOfEpochCheckpointOnTwoRanks) {
  check_case(Case{.stage = 3, .train_size = 144, .epochs = 2, .max_steps = 0, .checkpoint_every = 0,
                  .death = 8, .restored = 6, .steps = 6 + 144 / (2 * kPerRank)});
}

// The newest checkpoint (step 4) fails its checksum on load: the survivors
// agree to skip it, move it aside and roll back to the one before (step 2).
TEST(InJobZero, AnUnreadableNewestCheckpointFallsBackToTheOneBefore) {
  check_case(Case{.stage = 2, .checkpoint_every = 2, .death = 5, .restored = 2, .corrupt = 4});
}

// No checkpoint yet: back to the run's start, the model drawn again from
// run.seed; equal to a fresh run on 2 ranks.
TEST(InJobZero, Zero1WithoutACheckpointRestartsTheRunInTheSameProcesses) {
  check_case(Case{.stage = 1, .checkpoint_every = 0, .death = 5, .restored = 0});
}

}  // namespace
}  // namespace paratrain

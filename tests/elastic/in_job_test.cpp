// In-job recovery (elastic.in_job, train/recovery/in_job.h): ranks are threads with
// their own Gloo groups over one test-held store; one thread "dies" after
// step kDeath by aborting its group and leaving. The survivors must end
// equal to the single-process oracle that trains the first kDeath steps with
// the 3-rank global batch and the rest of the epoch's permutation with the
// 2-rank one: proof that the failed step was redone, no gradient of it
// leaked, and the dead rank's remaining samples were trained by the others.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/rejoin.h"
#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/recovery/in_job.h"
#include "paratrain/train/trainer.h"
#include "tests/elastic/in_job_support.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain {
namespace {

using testing::Died;
using testing::Params;
using testing::RankOutcome;
using testing::recovery_records;

constexpr int kWorld = 3;
constexpr int64_t kPerRank = 8;
constexpr int64_t kDeath = 5;   // the dying rank completes this many steps
constexpr int64_t kSteps = 20;  // train.max_steps: 15 more after the death

train::TrainConfig config(const std::string& dir, bool in_job) {
  auto c = testing::mlp_oracle_config(dir, "in_job", 0);
  c.data.synthetic_train_size = 576;  // 24 global batches of 24: no padding at 3 or 2 ranks
  c.data.global_batch_size = kPerRank * kWorld;
  c.data.prefetch = 0;
  c.optimizer.kind = "sgd";
  c.optimizer.momentum = 0.9;  // optimizer state the survivors must carry over
  c.optimizer.lr = 0.05;
  c.train.max_steps = kSteps;
  c.world.timeout_s = 30;
  c.elastic.in_job = in_job;
  return c;
}

// Runs the job on kWorld threads; `dying` (-1: none) dies after kDeath.
std::vector<RankOutcome> run_job(const train::TrainConfig& c, int dying, bool with_rejoiner) {
  return testing::run_job_with_death(c, kWorld, dying, kDeath, with_rejoiner);
}

// One process: kDeath steps of 3 x kPerRank over P[0, 3 kPerRank kDeath),
// then 2 x kPerRank per step over the rest of P. The strided split makes a
// step of R ranks with per-rank batch B the step of one process over the
// next R*B positions of P (Note [Strided split] in data/sampler.cpp).
Params oracle(const train::TrainConfig& c, int64_t steps = kSteps, int resumed_world = kWorld - 1) {
  auto data = train::load_datasets(c);
  torch::manual_seed(static_cast<uint64_t>(c.run.seed));
  auto model = train::make_model(c);
  auto optimizer = train::make_optimizer(c.optimizer, model->parameters());
  data::SamplerOptions one;
  one.shuffle = c.data.shuffle;
  one.seed = static_cast<uint64_t>(c.run.seed);
  const auto order = data::DistributedSampler(data.train.size(), one).indices();
  int64_t at = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t batch = (step < kDeath ? kWorld : step < kSteps ? kWorld - 1 : resumed_world) * kPerRank;
    auto b = data::gather(data.train, order.slice(0, at, at + batch));
    at += batch;
    optimizer->zero_grad();
    torch::nn::functional::cross_entropy(model->forward(b.inputs), b.targets).backward();
    optimizer->step();
  }
  Params out;
  for (const auto& p : model->named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  return out;
}

void expect_survivors_equal_oracle(const std::vector<RankOutcome>& out, int dying, const Params& expected) {
  for (int rank = 0; rank < kWorld; ++rank) {
    if (rank == dying) {
      ASSERT_TRUE(out[rank].error);
      EXPECT_THROW(std::rethrow_exception(out[rank].error), Died);
      continue;
    }
    if (out[rank].error) {
      try {
        std::rethrow_exception(out[rank].error);
      } catch (const std::exception& e) {
        FAIL() << "survivor " << rank << " failed: " << e.what();
      }
    }
    EXPECT_EQ(out[rank].result.recoveries, 1);
    EXPECT_EQ(out[rank].result.world_size, kWorld - 1);
    EXPECT_EQ(out[rank].result.steps, kSteps);
    // float32, 20 SGD steps: the DDP mean of per-rank means and the
    // one-process mean sum in different orders (~1e-7 relative per step).
    const double diff = testing::relative_diff(*out[rank].params, expected);
    EXPECT_LT(diff, 1e-5) << "rank " << rank;
    ::testing::Test::RecordProperty(fmt::format("rank{}_relative_diff", rank), fmt::format("{:.3g}", diff));
  }
}

TEST(InJob, SurvivorsOfADeadRankEqualTheRunContinuedAtTheSmallerWorldOverTheRemainingSamples) {
  const auto dir = testing::temp_dir("in_job");
  const auto c = config(dir, true);
  const auto out = run_job(c, /*dying=*/2, true);
  const Params expected = oracle(c);
  expect_survivors_equal_oracle(out, 2, expected);
  // The oracle can tell: the same steps without the switch to the survivors'
  // batch (all 20 at 3 x kPerRank) end elsewhere.
  auto no_shrink = c;
  no_shrink.elastic.in_job = false;
  no_shrink.run.name = "undisturbed";
  const Params undisturbed = testing::train_on(no_shrink, *[] {
    return std::shared_ptr<comm::ProcessGroup>(comm::make_gloo_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, {}));
  }());
  const double undisturbed_diff = testing::relative_diff(undisturbed, expected);
  EXPECT_GT(undisturbed_diff, 1e-3);
  RecordProperty("undisturbed_relative_diff", fmt::format("{:.3g}", undisturbed_diff));

  const auto records = recovery_records(out[0].result.run_dir / "metrics.jsonl");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["dead_ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(records[0]["world_size"], 2);
  EXPECT_EQ(records[0]["redo_step"], kDeath + 1);
  EXPECT_EQ(records[0]["first_position"], kDeath * kWorld * kPerRank);
}

// The survivors' last checkpoint (step kSteps, mid-epoch) records where they
// stood in the epoch's permutation, so a restart resumes it exactly, on the
// survivors' world size or on the configured one.
TEST(InJob, ACheckpointSavedAfterARecoveryResumesFromWhereTheSurvivorsStood) {
  const auto dir = testing::temp_dir("in_job_resume");
  const auto c = config(dir, true);
  const auto out = run_job(c, /*dying=*/2, true);
  ASSERT_FALSE(out[0].error);
  const auto checkpoint = out[0].result.last_checkpoint;
  ASSERT_EQ(checkpoint.filename(), "step_00000020");
  for (int world : {kWorld - 1, kWorld}) {
    auto resumed = c;
    resumed.elastic.in_job = false;
    resumed.run.name = fmt::format("resumed_on_{}", world);
    resumed.train.resume = checkpoint.string();
    resumed.train.max_steps = kSteps + 4;
    resumed.data.global_batch_size = world * kPerRank;
    std::vector<Params> params(world);
    testing::run_ranks(world, [&](comm::ProcessGroup& group) {
      params[group.rank()] = testing::train_on(resumed, group);
    });
    const double diff = testing::relative_diff(params[0], oracle(c, kSteps + 4, world));
    EXPECT_LT(diff, 1e-5) << "resumed on " << world << " ranks";
    RecordProperty(fmt::format("resumed_on_{}_relative_diff", world), fmt::format("{:.3g}", diff));
  }
}

TEST(InJob, RankZeroDyingReElectsTheLowestSurvivorAsRankZero) {
  const auto dir = testing::temp_dir("in_job_r0");
  const auto c = config(dir, true);
  const auto out = run_job(c, /*dying=*/0, true);
  expect_survivors_equal_oracle(out, 0, oracle(c));
  // Old rank 1 is the new rank 0: it writes the record rank 0 would have.
  const auto records = recovery_records(out[1].result.run_dir / "metrics.jsonl");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["dead_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(records[0]["survivors"], nlohmann::json::array({1, 2}));
}

TEST(InJob, WithoutInJobTheSurvivorsFailWithACommError) {
  const auto dir = testing::temp_dir("in_job_off");
  const auto out = run_job(config(dir, false), /*dying=*/2, false);
  for (int rank : {0, 1}) {
    ASSERT_TRUE(out[rank].error) << "rank " << rank << " went on without in-job recovery";
    EXPECT_THROW(std::rethrow_exception(out[rank].error), CommError);
  }
}

TEST(InJob, InJobWithoutAStoreToRejoinInIsAConfigError) {
  const auto dir = testing::temp_dir("in_job_nostore");
  auto group = comm::make_gloo_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, {});
  train::Trainer trainer(config(dir, true), *group);
  EXPECT_THROW(trainer.fit(), ConfigError);
}

// ZeRO and FSDP recover by rolling back (in_job_zero_test.cpp); pipeline,
// tensor/context parallel and parameter-server runs are still refused, each
// by name. ZeRO/FSDP configs passing validation shows the refusal is about
// the strategy named, not about sharding in general.
TEST(InJob, NonDataParallelStrategiesAreRefusedByName) {
  const auto base = config(testing::temp_dir("in_job_refused"), true);
  auto tp = base;
  tp.parallel.tp = 2;
  auto pp = base;
  pp.parallel.pp = 2;
  auto ps = base;
  ps.ps.servers = 1;
  for (const auto& [c, named] : {std::pair{tp, "parallel.tp = 2"}, std::pair{pp, "parallel.pp = 2"},
                                 std::pair{ps, "ps.servers = 1"}}) {
    try {
      train::validate_config(c);
      ADD_FAILURE() << named << " with elastic.in_job was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("elastic.in_job"), std::string::npos) << e.what();
    }
  }
  for (int64_t stage : {1, 2, 3}) {
    auto zero = base;
    zero.zero.stage = stage;
    EXPECT_NO_THROW(train::validate_config(zero)) << "zero.stage = " << stage;
  }
}

// Every item of the epoch trained exactly once across a 3 -> 2 recovery:
// the indices 3 loaders handed out before the death plus those of the 2
// survivors' loaders positioned as recover_in_job positions them. The
// Trainer test above checks that the Trainer trains these batches (its
// parameters equal the oracle's only then); this one checks the accounting
// itself, including for a partial last batch.
// The items one loader hands out from its position to the end of the epoch
// (or `limit` batches).
void drain(data::Loader& loader, std::multiset<int64_t>& seen, int64_t limit = -1) {
  for (int64_t b = 0; limit < 0 || b < limit; ++b) {
    auto batch = loader.next();
    if (!batch) break;
    for (int64_t i = 0; i < batch->targets.numel(); ++i) seen.insert(batch->targets[i].item<int64_t>());
  }
}

std::multiset<int64_t> across_recovery(bool offset) {
  const int64_t n = 102, batch = 4, taken = 3;  // 3 ranks x 3 batches x 4 = 36 consumed; 66 left for 2 ranks
  const data::TensorDataset dataset(torch::arange(n).to(torch::kFloat).unsqueeze(1), torch::arange(n));
  data::LoaderOptions lo;
  lo.batch_size = batch;
  lo.prefetch_depth = 0;
  std::multiset<int64_t> seen;
  data::LoaderState at;
  for (int r = 0; r < 3; ++r) {
    data::SamplerOptions so{.num_replicas = 3, .rank = r, .shuffle = true, .seed = 9, .drop_last = false, .shares = {}};
    data::Loader loader(dataset, data::DistributedSampler(n, so), lo);
    loader.set_epoch(1);
    drain(loader, seen, taken);
    at = loader.state();
  }
  const int64_t consumed = train::consumed_positions(at, batch, 3);
  EXPECT_EQ(consumed, 36);
  for (int r = 0; r < 2; ++r) {
    data::SamplerOptions so{.num_replicas = 2, .rank = r, .shuffle = true, .seed = 9, .drop_last = false, .shares = {}};
    data::Loader loader(dataset, data::DistributedSampler(n, so), lo);
    // Without the offset: what resuming at the loader's own batch count on
    // the smaller world would do.
    loader.load_state(offset ? data::LoaderState{1, 0, consumed} : at);
    drain(loader, seen);
  }
  return seen;
}

TEST(InJob, NoSampleOfTheEpochIsSkippedOrRepeated) {
  std::multiset<int64_t> every;
  for (int64_t i = 0; i < 102; ++i) every.insert(i);
  EXPECT_EQ(across_recovery(true), every);
  // Negative control: survivors that resume at their own batch count skip
  // some items and repeat others.
  EXPECT_NE(across_recovery(false), every);
}

}  // namespace
}  // namespace paratrain

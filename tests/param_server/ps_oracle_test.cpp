// Parameter servers through the whole Trainer against the single-process
// oracle: ps.mode = "sync" with 1 and 2 servers and 2 and 3 workers, SGD
// (momentum) and Adam, equals one process on the global batch; so does
// "ssp" with staleness 0. Negative controls show the tolerance separates
// those from wrong averaging (async: one step per push) and from no
// exchange at all. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>


#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/param_server/ps_training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

using testing::Params;
using testing::relative_diff;
using testing::small_config;
using testing::train;

// Float32 sums in another order (per-worker means summed on the server,
// then divided) differ by a few ulps per step; 20 steps of Adam or momentum
// SGD keep that far below 1e-5 relative. The negative controls below differ
// by more than 1e-3, so the tolerance tells them apart.
constexpr double kTolerance = 1e-5;

class PsSyncOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(PsSyncOracle, OneAndTwoServersTimesTwoAndThreeWorkersEqualOneProcess) {
  const std::string optimizer = GetParam();
  auto dir = paratrain::testing::temp_dir("ps_sync");
  const Params single = train(small_config(dir + "/single", optimizer), 1);
  for (int servers : {1, 2}) {
    for (int workers : {2, 3}) {
      auto cfg = small_config(dir + fmt::format("/s{}w{}", servers, workers), optimizer);
      cfg.ps.servers = servers;
      const double diff = relative_diff(train(cfg, servers + workers), single);
      EXPECT_LT(diff, kTolerance) << optimizer << " with " << servers << " servers and " << workers << " workers";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PsSyncOracle, ::testing::Values("sgd", "adam"));

// The project's layer-wise optimizers step server pieces too: LAMB's
// per-tensor norms are completed across the two servers holding pieces.
TEST(PsSyncOracle, LambWithTwoServersEqualsOneProcess) {
  auto dir = paratrain::testing::temp_dir("ps_lamb");
  auto single_cfg = small_config(dir + "/single", "lamb");
  single_cfg.optimizer.lr = 0.01;
  const Params single = train(single_cfg, 1);
  auto cfg = single_cfg;
  cfg.run.output_dir = dir + "/ps";
  cfg.ps.servers = 2;
  EXPECT_LT(relative_diff(train(cfg, 4), single), kTolerance);
}

TEST(PsSspOracle, StalenessZeroEqualsOneProcess) {
  auto dir = paratrain::testing::temp_dir("ps_ssp0");
  const Params single = train(small_config(dir + "/single", "adam"), 1);
  auto cfg = small_config(dir + "/ssp", "adam");
  cfg.ps.servers = 2;
  cfg.ps.mode = "ssp";
  cfg.ps.staleness = 0;
  cfg.ps.slow_worker = 1;  // arrival order varies; the result must not
  cfg.ps.slow_ms = 2;
  EXPECT_LT(relative_diff(train(cfg, 5), single), kTolerance);
}

// metrics.jsonl gets one staleness histogram per worker: every push
// counted, none staler than the bound, and the slowed worker's peers stale.
TEST(PsSspMetrics, EachWorkerHasAStalenessHistogramWithinTheBound) {
  auto dir = paratrain::testing::temp_dir("ps_ssp2");
  auto cfg = small_config(dir, "sgd");
  cfg.ps.servers = 1;
  cfg.ps.mode = "ssp";
  cfg.ps.staleness = 2;
  cfg.ps.slow_worker = 0;
  cfg.ps.slow_ms = 10;
  train(cfg, 4);
  const auto records = testing::worker_records(dir + "/t/version_0");
  int64_t most = 0;
  for (const auto& j : records) {
    EXPECT_EQ(j["pushes"].get<int64_t>(), cfg.train.max_steps) << j;
    EXPECT_LE(j["max"].get<int64_t>(), 2) << j;
    most = std::max(most, j["max"].get<int64_t>());
  }
  EXPECT_EQ(records.size(), 3u);
  EXPECT_GE(most, 1) << "no gradient was stale: the slowed worker did not hold the others back";
}

TEST(PsSyncOracle, NegativeControlsAreFarFromTheOracle) {
  auto dir = paratrain::testing::temp_dir("ps_neg");
  const Params single = train(small_config(dir + "/single", "adam"), 1);
  // The same servers and data, but each push applied on its own instead of
  // the average of all workers': what wrong averaging computes.
  auto async = small_config(dir + "/async", "adam");
  async.ps.servers = 1;
  async.ps.mode = "async";
  EXPECT_GT(relative_diff(train(async, 3), single), 1e-3);
  // One worker alone on its share of each global batch: no exchange at all.
  auto alone = small_config(dir + "/alone", "adam");
  alone.data.global_batch_size = 12;
  EXPECT_GT(relative_diff(train(alone, 1), single), 1e-3);
}

TEST(PsConfig, RejectsServersWithoutWorkersAndBadSlowWorker) {
  auto dir = paratrain::testing::temp_dir("ps_bad");
  auto cfg = small_config(dir + "/a", "sgd");
  cfg.ps.servers = 2;
  EXPECT_THROW(train(cfg, 2), ConfigError);
  cfg.ps.servers = 1;
  cfg.ps.slow_worker = 2;
  EXPECT_THROW(train(cfg, 2), ConfigError);
  cfg.ps.slow_worker = -1;
  cfg.optimizer.clip_grad_norm = 1.0;
  EXPECT_THROW(train::validate_config(cfg), ConfigError);
}

}  // namespace
}  // namespace paratrain::param_server

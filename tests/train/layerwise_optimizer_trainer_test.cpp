// LARS and LAMB (optimizer.kind = "lars" | "lamb") through the Trainer: under
// DDP and ZeRO 1-3 (optimizer params are flat shard pieces, per-tensor norms
// summed across ranks) they equal one unsharded process; their state survives
// a checkpoint and a resume. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>

#include "paratrain/optim/lamb.h"
#include "paratrain/optim/lars.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

// Rates large enough that 12 steps move every tensor by several percent
// (LARS: lr * eta = 1% of ||w|| per step before momentum; LAMB: lr = 1%),
// and the comparison is of updates, not of weights.
TrainConfig small_config(const std::string& dir, const std::string& kind) {
  TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 7;
  c.run.log_every = 0;
  c.model.kind = "mlp";
  c.model.hidden = {24, 16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 48;
  c.data.synthetic_image_size = 6;
  c.data.global_batch_size = 24;
  c.optimizer.kind = kind;
  c.optimizer.lr = kind == "lars" ? 0.1 : 0.01;
  c.optimizer.trust_coefficient = 0.1;
  c.optimizer.weight_decay = 1e-3;
  c.train.epochs = 1;
  c.train.max_steps = 12;
  c.train.eval_every_epochs = 0;
  c.zero.unit_min_params = 200;  // several FSDP units
  return c;
}

struct Trajectory {
  Params before;
  Params after;
};

// Trains on `world` thread-ranks; `tweak` runs on each rank's Trainer
// before fit (negative controls). Rank 0's parameters before and after.
Trajectory train(const TrainConfig& cfg, int world, const std::function<void(Trainer&)>& tweak = {}) {
  Trajectory run;
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    auto before = t.full_parameters();
    if (tweak) tweak(t);
    t.fit();
    auto after = t.full_parameters();
    if (g.rank() == 0) run = {before, after};
  });
  return run;
}

// max over tensors of max|update_a - update_b| / max|update_b|, update =
// after - before: scale-free in the step, not in the weights.
double update_diff(const Trajectory& a, const Trajectory& b) {
  EXPECT_EQ(a.after.size(), b.after.size());
  double worst = 0;
  for (size_t i = 0; i < a.after.size() && i < b.after.size(); ++i) {
    EXPECT_EQ(a.after[i].first, b.after[i].first);
    const at::Tensor ua = a.after[i].second - a.before[i].second;
    const at::Tensor ub = b.after[i].second - b.before[i].second;
    const double scale = std::max(ub.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (ua - ub).abs().max().item<double>() / scale);
  }
  return worst;
}

Trajectory oracle(const std::string& dir, const std::string& kind) {
  auto cfg = small_config(dir, kind);
  cfg.ddp.mode = "none";
  return train(cfg, 1);
}

// Float32 gradients averaged in another order differ by a few ulps; the
// norms are summed in float64 (layer_norms.h), so the trust ratios agree to
// ~1e-7 and 12 steps stay far below 1e-4 of the total update. Per-shard
// norms without the cross-rank sum (the negative control) are > 1e-2 off.
constexpr double kTolerance = 1e-4;

class LayerwiseOracle : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// 3 ranks: ZeRO pieces straddle tensors, so most norms need other ranks'
// pieces.
TEST_P(LayerwiseOracle, ThreeRanksEqualOneUnshardedProcess) {
  const auto [kind, stage] = GetParam();
  auto dir = paratrain::testing::temp_dir("layerwise");
  const Trajectory single = oracle(dir + "/single", kind);
  auto cfg = small_config(dir + "/sharded", kind);
  cfg.zero.stage = stage;
  const double diff = update_diff(train(cfg, 3), single);
  RecordProperty("max_update_diff", std::to_string(diff));
  EXPECT_LT(diff, kTolerance) << kind << " zero.stage " << stage;
}

INSTANTIATE_TEST_SUITE_P(KindsAndStages, LayerwiseOracle,
                         ::testing::Combine(::testing::Values("lars", "lamb"), ::testing::Values(0, 1, 2, 3)));

// The same runs without the norm reduction across shards (each rank's trust
// ratios from its own pieces), and plain SGD in place of LARS: both far away.
TEST(LayerwiseOracle, NegativeControlsAreFarFromTheOracle) {
  auto dir = paratrain::testing::temp_dir("layerwise_neg");
  for (std::string kind : {"lars", "lamb"}) {
    const Trajectory single = oracle(dir + "/single_" + kind, kind);
    auto cfg = small_config(dir + "/local_" + kind, kind);
    cfg.zero.stage = 1;
    const double local = update_diff(train(cfg, 3,
                                           [&](Trainer& t) {
                                             if (kind == "lars")
                                               dynamic_cast<paratrain::optim::Lars&>(t.optimizer())
                                                   .set_norm_reducer({});
                                             else
                                               dynamic_cast<paratrain::optim::Lamb&>(t.optimizer())
                                                   .set_norm_reducer({});
                                           }),
                                      single);
    RecordProperty("local_norms_diff_" + kind, std::to_string(local));
    EXPECT_GT(local, 1e-2) << kind;
  }
  auto sgd = small_config(dir + "/sgd", "sgd");
  sgd.ddp.mode = "none";
  sgd.optimizer.lr = 0.05;
  EXPECT_GT(update_diff(train(sgd, 1), oracle(dir + "/single_sgd", "lars")), 1e-1);
}

// Stop at step 6 under ZeRO-1 on 2 ranks (sharded optimizer state in the
// checkpoint), resume to step 12: equal to 12 steps in one go. Negative
// control: the same resume with the optimizer state dropped.
TEST(LayerwiseCheckpoint, ResumedRunEqualsUninterrupted) {
  auto dir = paratrain::testing::temp_dir("layerwise_resume");
  for (std::string kind : {"lars", "lamb"}) {
    auto full = small_config(dir + "/full_" + kind, kind);
    full.zero.stage = 1;
    const Trajectory uninterrupted = train(full, 2);

    auto first = small_config(dir + "/split_" + kind, kind);
    first.zero.stage = 1;
    first.train.max_steps = 6;
    train(first, 2);
    const auto ckpt = std::filesystem::path(dir) / ("split_" + kind) / "t" / "version_0" / "checkpoints" / "step_00000006";
    ASSERT_TRUE(std::filesystem::exists(ckpt / "index.json"));

    for (bool drop_state : {false, true}) {
      auto resumed = small_config(dir + "/resumed_" + kind + (drop_state ? "_drop" : ""), kind);
      resumed.train.resume = ckpt.string();
      resumed.zero.stage = 1;
      Trajectory r = train(resumed, 2, [&](Trainer& t) {
        if (drop_state) t.optimizer().state().clear();
      });
      r.before = uninterrupted.before;  // compare whole trajectories from step 0
      const double diff = update_diff(r, uninterrupted);
      RecordProperty("resume_diff_" + kind + (drop_state ? "_dropped" : ""), std::to_string(diff));
      if (drop_state) {
        EXPECT_GT(diff, 1e-3) << kind;
      } else {
        EXPECT_LT(diff, 1e-6) << kind;
      }
    }
  }
}

}  // namespace

// The Trainer end to end on threads: 2-rank DDP training through the whole
// stack (config, sampler, loader, DDP, optimizer) equals one process trained
// on the same global batches; and a resumed run equals an uninterrupted one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;

TrainConfig small_config(const std::string& dir) {
  TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 7;
  c.run.log_every = 5;
  c.model.kind = "mlp";
  c.model.hidden = {32};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 512;
  c.data.synthetic_test_size = 128;
  c.data.synthetic_image_size = 8;
  c.data.batch_size = 16;
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.train.epochs = 2;
  return c;
}

std::vector<at::Tensor> params_of(const Trainer& t) {
  std::vector<at::Tensor> out;
  for (auto& p : t.model()->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Float32 sums in a different order (per-rank means then all-reduce vs one
// mean over the global batch) differ by a few ulps per step; over 64 steps
// with momentum that stays well below 1e-5 relative on these small weights.
void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double rtol = 1e-5,
                  double atol = 1e-6) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, atol))
        << "parameter " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}

TEST(Trainer, TwoRankDdpEqualsOneProcessOnTheGlobalBatch) {
  auto dir = paratrain::testing::temp_dir("trainer");
  // One process, global batch 32.
  auto single_cfg = small_config(dir + "/single");
  single_cfg.data.batch_size = 32;
  single_cfg.ddp.mode = "none";
  std::vector<at::Tensor> single;
  double single_acc = 0;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(single_cfg, g);
    auto r = t.fit();
    single = params_of(t);
    single_acc = r.test.accuracy;
    EXPECT_EQ(r.test.count, 128);
    EXPECT_EQ(r.steps, 2 * 512 / 32);
  });
  for (std::string mode : {"bucketed", "naive"}) {
    auto cfg = small_config(dir + "/" + mode);
    cfg.ddp.mode = mode;
    std::vector<std::vector<at::Tensor>> per_rank(2);
    paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
      Trainer t(cfg, g);
      auto r = t.fit();
      per_rank[g.rank()] = params_of(t);
      EXPECT_EQ(r.steps, 2 * 512 / 32);
      EXPECT_EQ(r.test.count, 128);
      EXPECT_NEAR(r.test.accuracy, single_acc, 1e-3);
    });
    SCOPED_TRACE(mode);
    expect_close(per_rank[0], single);
    expect_close(per_rank[1], single);
  }
  // A rank training alone on its half-size batches (what DDP without the
  // all-reduce amounts to) ends far from the oracle: the tolerance above can
  // tell synchronised training from unsynchronised.
  auto alone_cfg = small_config(dir + "/alone");
  alone_cfg.data.batch_size = 16;
  alone_cfg.ddp.mode = "none";
  alone_cfg.train.max_steps = 2 * 512 / 32;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(alone_cfg, g);
    t.fit();
    auto alone = params_of(t);
    double max_diff = 0;
    for (size_t i = 0; i < alone.size(); ++i) max_diff = std::max(max_diff, (alone[i] - single[i]).abs().max().item<double>());
    EXPECT_GT(max_diff, 1e-3);
  });
}

// A re-run gets a new version (run_versions_test.cpp); a run pinned to a
// version that holds checkpoints must not train over them unasked.
TEST(Trainer, AFreshRunRefusesAPinnedVersionWithCheckpoints) {
  auto dir = paratrain::testing::temp_dir("fresh");
  auto cfg = small_config(dir);
  cfg.train.max_steps = 4;
  cfg.run.version = 0;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) { Trainer(cfg, g).fit(); });
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    EXPECT_THROW(Trainer(cfg, g), paratrain::ConfigError);
  });
}

TEST(Trainer, ResumedRunEqualsUninterruptedRun) {
  auto dir = paratrain::testing::temp_dir("resume");
  auto full_cfg = small_config(dir + "/full");
  full_cfg.train.max_steps = 24;  // stops mid second epoch (16 steps per epoch)
  std::vector<std::vector<at::Tensor>> full(2);
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(full_cfg, g);
    t.fit();
    full[g.rank()] = params_of(t);
  });

  auto cfg = small_config(dir + "/split");
  cfg.train.max_steps = 10;  // stop mid first epoch and checkpoint there
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    EXPECT_EQ(t.fit().steps, 10);
  });
  cfg.train.max_steps = 24;
  cfg.train.resume = "auto";
  std::vector<std::vector<at::Tensor>> resumed(2);
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    auto r = t.fit();
    EXPECT_EQ(r.start_step, 10);  // it really resumed, rather than retraining from step 0
    EXPECT_EQ(r.steps, 24);
    resumed[g.rank()] = params_of(t);
  });
  // Same batches, same optimizer state, same arithmetic: bit-identical.
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < full[r].size(); ++i) EXPECT_TRUE(torch::equal(full[r][i], resumed[r][i])) << i;
  }
}

}  // namespace

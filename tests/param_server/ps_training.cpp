// Shared by the parameter-server tests: see ps_training.h.
#include "tests/param_server/ps_training.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server::testing {

train::TrainConfig small_config(const std::string& dir, const std::string& optimizer) {
  train::TrainConfig c;
  c.run.name = "t";
  c.run.output_dir = dir;
  c.run.seed = 11;
  c.run.log_every = 0;
  c.model.kind = "mlp";
  c.model.hidden = {24, 16};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 96;
  c.data.synthetic_image_size = 6;
  c.data.global_batch_size = 24;
  c.optimizer.kind = optimizer;
  c.optimizer.lr = optimizer == "sgd" ? 0.05 : 0.003;
  c.train.epochs = 1;
  c.train.max_steps = 20;
  c.train.eval_every_epochs = 0;
  c.world.timeout_s = 60;  // a hang fails the test instead of stalling it
  c.ddp.mode = "none";  // one process; the ps strategy ignores it
  return c;
}

Params train(const train::TrainConfig& cfg, int world, const std::function<void(train::Trainer&)>& tweak) {
  std::vector<Params> per_rank(world);
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    train::Trainer t(cfg, g);
    if (tweak) tweak(t);
    t.fit();
    per_rank[g.rank()] = t.full_parameters();
  });
  for (int r = 1; r < world; ++r) {
    for (size_t i = 0; i < per_rank[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(per_rank[0][i].second, per_rank[r][i].second))
          << "rank " << r << " differs from rank 0 on " << per_rank[0][i].first;
    }
  }
  return per_rank[0];
}

double relative_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

std::vector<nlohmann::json> worker_records(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  EXPECT_TRUE(in.good()) << "no metrics.jsonl in " << run_dir;
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "ps_staleness") out.push_back(std::move(j));
  }
  return out;
}

}  // namespace paratrain::param_server::testing

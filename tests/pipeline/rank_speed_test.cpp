// pipeline.balance = "rank_speed" (Note [Stages by rank speed] in
// paratrain/train/strategies/pipeline_strategy.cpp): a stage on slower ranks
// gets less of the model, and the trained model is still one process's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace pt = paratrain::train;

namespace {

// The 8-layer MLP of the pipeline oracle (pipeline_trainer_test.cpp).
pt::TrainConfig deep(const std::string& dir, const std::string& name) {
  pt::TrainConfig c;
  c.run.name = name;
  c.run.output_dir = dir;
  c.run.seed = 5;
  c.run.log_every = 0;
  c.model.kind = "mlp";
  c.model.hidden = {20, 18, 16, 16, 14, 12, 12};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 1800;
  c.data.synthetic_test_size = 50;
  c.data.synthetic_image_size = 5;
  c.data.global_batch_size = 180;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.train.epochs = 1;
  c.train.max_steps = 10;
  c.train.eval_every_epochs = 0;
  c.pipeline.trace_steps = 0;
  return c;
}

// Layers per stage from the checkpoint's pipeline.layer_bounds ("0,6,8").
std::vector<int> layers_per_stage(const std::filesystem::path& checkpoint) {
  std::ifstream in(checkpoint / "index.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("pipeline.layer_bounds");
  EXPECT_NE(at, std::string::npos) << text;
  if (at == std::string::npos) return {};
  const auto open = text.find('"', at + 22);
  std::stringstream bounds(text.substr(open + 1, text.find('"', open + 1) - open - 1));
  std::vector<int> b;
  for (std::string part; std::getline(bounds, part, ',');) b.push_back(std::stoi(part));
  std::vector<int> out;
  for (size_t i = 1; i < b.size(); ++i) out.push_back(b[i] - b[i - 1]);
  return out;
}

}  // namespace

// Chunk j's cost is scaled by its stage's slowness: a 3x slower second stage
// gets a quarter of uniform layers; scales of 1 change nothing.
TEST(RankSpeedPartition, ScalesEachChunksCost) {
  const std::vector<double> uniform(8, 1.0);
  EXPECT_EQ(paratrain::pipeline::balanced_partition(uniform, 2, {1.0, 3.0}), (std::vector<int>{0, 6, 8}));
  EXPECT_EQ(paratrain::pipeline::balanced_partition(uniform, 2, {2.0, 1.0}), (std::vector<int>{0, 2, 8}));  // 4 and 6
  EXPECT_EQ(paratrain::pipeline::balanced_partition(uniform, 2, {1.0, 1.0}),
            paratrain::pipeline::balanced_partition(uniform, 2));
  // Interleaved: chunks 0 and 2 on stage 0, 1 and 3 on the slow stage 1.
  const auto b = paratrain::pipeline::balanced_partition(std::vector<double>(12, 1.0), 4, {1.0, 2.0, 1.0, 2.0});
  EXPECT_EQ(b, (std::vector<int>{0, 4, 6, 10, 12}));
  EXPECT_THROW(paratrain::pipeline::balanced_partition(uniform, 2, {1.0}), c10::Error);
  EXPECT_THROW(paratrain::pipeline::balanced_partition(uniform, 2, {1.0, 0.0}), c10::Error);
}

// Stage 1's rank computes 3x slower (profile.test_slow_factor, as in
// training): it gets fewer layers than stage 0, and the model after 10
// steps equals one process's.
TEST(RankSpeedPartition, ASlowStageGetsFewerLayersAndTheModelIsStillOneProcesss) {
  const std::string dir = paratrain::testing::temp_dir("rank_speed");
  auto c = deep(dir, "slow");
  c.parallel.pp = 2;
  c.pipeline.schedule = "1f1b";
  c.pipeline.microbatches = 4;
  c.pipeline.balance = "rank_speed";
  c.profile.test_slow_rank = 1;
  c.profile.test_slow_factor = 3;
  std::filesystem::path checkpoint;
  paratrain::testing::Params ranks;
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    pt::Trainer t(c, g);
    const auto result = t.fit();
    auto p = t.full_parameters();
    if (g.rank() == 0) {
      ranks = std::move(p);
      checkpoint = result.last_checkpoint;
    }
  });
  const auto layers = layers_per_stage(checkpoint);
  ASSERT_EQ(layers.size(), 2u);
  std::printf("rank_speed with stage 1 slowed 3x: %d and %d layers\n", layers[0], layers[1]);
  EXPECT_GT(layers[0], layers[1]);
  EXPECT_LE(layers[1], 3);
  auto one = deep(dir, "one");
  one.ddp.mode = "none";
  const double diff = paratrain::testing::relative_diff(ranks, paratrain::testing::one_process(one));
  std::printf("rank_speed pipeline vs one process after 10 SGD steps: %.2e\n", diff);
  EXPECT_LT(diff, 1e-5);

  pt::TrainConfig gpt;
  pt::apply_override(gpt, "model.kind=gpt");
  pt::apply_override(gpt, "data.dataset=text");
  pt::apply_override(gpt, "parallel.pp=2");
  pt::apply_override(gpt, "parallel.tp=2");
  pt::apply_override(gpt, "pipeline.balance=rank_speed");
  try {
    pt::validate_config(gpt);
    ADD_FAILURE() << "rank_speed under the megatron strategy was accepted";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_speed applies to the pipeline strategy"), std::string::npos) << e.what();
  }
}

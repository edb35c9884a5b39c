// Static freezing (freeze.modules) under the megatron strategy (Note
// [Freezing in the megatron strategy]): a GPT at tp = 2 (also with
// Megatron-SP), cp = 2, in pipeline stages under ZeRO-1 (pp = 2 x dp = 2) and
// at tp = 2 x pp = 2. The frozen tensors stay bitwise as drawn, and the
// trainable ones equal one process with the same freezing; with the whole
// first stage frozen (the embedding, whose wte the head shares, and the
// first block), that stage runs forward only. A model split by
// parallel.tp_plan freezes the same way. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/freeze/freezing.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"
#include "tests/support/small_mlp.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

// Also checks, on every rank, that what is frozen there has no gradient (no
// sum over tp or tied stages made one up) and that the megatron strategy
// hands the optimizer trainable tensors only.
Params train(const TrainConfig& cfg, int world) {
  Params out;
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    for (const auto& item : t.model()->named_parameters()) {
      if (!item.value().requires_grad())
        EXPECT_FALSE(item.value().grad().defined()) << cfg.run.name << " rank " << g.rank() << ": " << item.key();
    }
    if (world > 1) {  // the megatron strategy's (one process runs DDP's, which lists them without stepping them)
      for (const auto& group : t.optimizer().param_groups())
        for (const auto& p : group.params()) EXPECT_TRUE(p.requires_grad()) << cfg.run.name << ": a frozen tensor listed";
    }
    auto params = t.full_parameters();
    if (g.rank() == 0) out = std::move(params);
  });
  return out;
}

Params initial_parameters(const TrainConfig& cfg) {
  Params out;
  for (const auto& item : paratrain::train::seeded_model_factory(cfg, c10::Device(c10::kCPU))()->named_parameters())
    out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

bool frozen(const std::string& name, const std::vector<std::string>& modules) {
  for (const auto& m : modules)
    if (paratrain::train::under_module(name, m)) return true;
  return false;
}

TEST(MegatronFreeze, FrozenTensorsStayAsDrawnAndTheRestEqualsOneProcess) {
  auto dir = paratrain::testing::temp_dir("freeze_megatron");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 3);
  auto config = [&](const std::string& name, const std::vector<std::string>& modules) {
    auto c = paratrain::testing::tiny_gpt_config(dir, corpus);
    c.run.name = name;
    c.train.max_steps = 6;
    c.data.global_batch_size = 16;
    c.freeze.modules = modules;
    return c;
  };
  const auto layouts =
      paratrain::testing::megatron_layouts({"tp2", "tp2_sp", "cp2", "pp2_dp2_zero1", "tp2_pp2", "tp2_cp2_zero3"});

  // The first block and the positions; then the whole first stage (the
  // 2-layer GPT's stages: embed + blocks.0 | blocks.1 + head), whose tied
  // wte freezes the head's projection too.
  const std::vector<std::vector<std::string>> sets = {{"wpe", "blocks.0"}, {"wte", "wpe", "blocks.0"}};
  for (const auto& modules : sets) {
    auto single = config("single_" + std::to_string(modules.size()), modules);
    single.ddp.mode = "none";
    const Params initial = initial_parameters(single);
    const Params oracle = train(single, 1);
    for (const auto& layout : layouts) {
      if (modules.size() == 3 && layout.name.find("pp2") == std::string::npos) continue;
      const std::string what = layout.name + " freezing " + std::to_string(modules.size()) + " modules";
      auto c = config(layout.name + "_" + std::to_string(modules.size()), modules);
      layout.apply(c);
      const Params run = train(c, layout.world);
      ASSERT_EQ(run.size(), oracle.size()) << what;
      double worst = 0;
      int frozen_count = 0;
      for (size_t i = 0; i < run.size(); ++i) {
        ASSERT_EQ(run[i].first, oracle[i].first) << what;
        if (frozen(run[i].first, modules)) {
          EXPECT_TRUE(torch::equal(run[i].second, initial[i].second)) << what << ": " << run[i].first << " moved";
          ++frozen_count;
          continue;
        }
        const double scale = std::max(oracle[i].second.abs().max().item<double>(), 1e-12);
        worst = std::max(worst, (run[i].second - oracle[i].second).abs().max().item<double>() / scale);
        // Trained: the oracle moved it.
        EXPECT_FALSE(torch::equal(oracle[i].second, initial[i].second)) << run[i].first;
      }
      std::cout << "[freeze] GPT at " << what << " vs one process: trainable relative diff " << worst << "\n";
      EXPECT_LT(worst, 1e-5) << what;
      EXPECT_GE(frozen_count, 13) << what;  // wpe + blocks.0's 12 tensors (+ wte)
    }
  }
}

// A program's kind of model under a plan: the MLP's fc0 split column-wise
// and fc1 row-wise, fc1 frozen (its shards) and fc0, fc2 training.
TEST(MegatronFreeze, APlannedModelFreezesItsShards) {
  auto dir = paratrain::testing::temp_dir("freeze_planned");
  auto single = paratrain::testing::small_mlp_config(dir + "/single");
  single.freeze.modules = {"fc1"};
  single.ddp.mode = "none";
  const Params initial = initial_parameters(single);
  const Params oracle = train(single, 1);
  auto planned = paratrain::testing::small_mlp_config(dir + "/planned");
  planned.freeze.modules = {"fc1"};
  planned.parallel.tp = 2;
  planned.parallel.tp_plan = {"fc0=colwise", "fc1=rowwise"};
  const Params run = train(planned, 2);
  ASSERT_EQ(run.size(), oracle.size());
  double worst = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    if (frozen(run[i].first, {"fc1"})) {
      EXPECT_TRUE(torch::equal(run[i].second, initial[i].second)) << run[i].first << " moved";
      continue;
    }
    const double scale = std::max(oracle[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (run[i].second - oracle[i].second).abs().max().item<double>() / scale);
  }
  std::cout << "[freeze] planned MLP at tp=2, fc1 frozen, vs one process: " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
}

std::vector<nlohmann::json> records_of(const std::filesystem::path& run_dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == kind) out.push_back(std::move(j));
  }
  return out;
}

// Adaptive freezing (freeze.adaptive) on the megatron strategy's layouts:
// each layer's gradient norm counts every element once (tp shards on their
// holders, replicated tensors once, ZeRO pieces on theirs, one cp and dp
// replica), so every layout measures the one process's norms and freezes
// the same prefix at the same step: the embedding (25% of the tiny GPT,
// under freeze.max_fraction = 0.3) at the second check, step 8.
TEST(MegatronFreeze, AdaptiveFreezingMeasuresAndDecidesAsOneProcess) {
  auto dir = paratrain::testing::temp_dir("adaptive_megatron");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 3);
  auto config = [&](const std::string& name) {
    auto c = paratrain::testing::tiny_gpt_config(dir, corpus);
    c.run.name = name;
    c.train.max_steps = 12;
    c.data.global_batch_size = 16;
    c.freeze.adaptive = true;
    c.freeze.check_every_steps = 4;
    c.freeze.threshold = 10.0;
    c.freeze.max_fraction = 0.3;
    return c;
  };
  auto single = config("single");
  single.ddp.mode = "none";
  const Params oracle = train(single, 1);
  auto norms_of = [&](const std::string& name) {
    std::map<int64_t, std::map<std::string, double>> out;
    for (const auto& r : records_of(std::filesystem::path(dir) / name / "version_0", "freeze_check"))
      for (const auto& [layer, v] : r["layers"].items())
        out[r["step"].get<int64_t>()][layer] = v["grad_norm"].get<double>();
    return out;
  };
  const auto single_norms = norms_of("single");
  ASSERT_EQ(single_norms.size(), 2u);
  const auto decided = records_of(std::filesystem::path(dir) / "single" / "version_0", "freeze");
  ASSERT_EQ(decided.size(), 1u);
  EXPECT_EQ(decided[0]["step"].get<int64_t>(), 8);
  EXPECT_EQ(decided[0]["layers"], nlohmann::json::array({"embed"}));
  const auto layouts =
      paratrain::testing::megatron_layouts({"tp2", "cp2", "pp2_dp2_zero1", "tp2_pp2", "tp2_cp2_zero3"});

  for (const auto& layout : layouts) {
    auto c = config(layout.name);
    layout.apply(c);
    const Params run = train(c, layout.world);
    const double worst = paratrain::testing::max_rel_diff(run, oracle);
    std::cout << "[adaptive] GPT at " << layout.name << " vs one process: relative diff " << worst << "\n";
    EXPECT_LT(worst, 1e-5) << layout.name;
    const auto norms = norms_of(layout.name);
    ASSERT_EQ(norms.size(), single_norms.size()) << layout.name;
    for (const auto& [step, layers] : single_norms)
      for (const auto& [layer, norm] : layers)
        EXPECT_NEAR(norms.at(step).at(layer), norm, 1e-5 * norm) << layout.name << " step " << step << " " << layer;
    const auto records = records_of(std::filesystem::path(dir) / layout.name / "version_0", "freeze");
    ASSERT_EQ(records.size(), 1u) << layout.name;
    EXPECT_EQ(records[0]["step"], decided[0]["step"]) << layout.name;
    EXPECT_EQ(records[0]["layers"], decided[0]["layers"]) << layout.name;
  }
}

}  // namespace

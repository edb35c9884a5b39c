// Adaptive freezing (freeze.adaptive): the AutoFreeze criterion on hand-made
// norms, and through the Trainer: the decision is taken at the same step on
// every rank and by one process alike, the frozen prefix stays as it was at
// that step, the decision is logged, and a resume (at another world size)
// keeps what was frozen. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/freeze/auto_freeze.h"
#include "paratrain/train/freeze/freezing.h"
#include "paratrain/train/freeze/refreeze.h"
#include "paratrain/models/model.h"
#include "paratrain/train/trainer.h"
#include "tests/support/small_mlp.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::AutoFreeze;
using paratrain::train::FreezeLayer;
using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

std::vector<FreezeLayer> four_layers() {
  return {{"a", {"a"}, 100, false}, {"b", {"b"}, 100, false}, {"c", {"c"}, 100, false}, {"d", {"d"}, 100, false}};
}

TEST(AutoFreezeCriterion, TheFirstCheckOnlyRecordsThenTheConvergedPrefixFreezes) {
  AutoFreeze f(four_layers(), /*threshold=*/0.1, /*max_fraction=*/1.0);
  EXPECT_TRUE(f.check({1.0, 2.0, 3.0, 4.0}).empty());  // nothing to compare with yet
  // a: 5% change, b: 5%, c: 50% (still changing), d: 0%: only the prefix a, b.
  EXPECT_EQ(f.check({1.05, 1.9, 4.5, 4.0}), (std::vector<int>{0, 1}));
  EXPECT_NEAR(f.last_changes()[0], 0.05, 1e-12);
  EXPECT_NEAR(f.last_changes()[2], 0.5, 1e-12);
  EXPECT_TRUE(f.layers()[0].frozen && f.layers()[1].frozen && !f.layers()[2].frozen);
  // c settles: it joins the prefix; d, the last layer that trains, never freezes.
  EXPECT_EQ(f.check({0.0, 0.0, 4.6, 4.0}), (std::vector<int>{2}));
  EXPECT_TRUE(f.check({0.0, 0.0, 0.0, 4.0}).empty());
  EXPECT_FALSE(f.layers()[3].frozen);
}

TEST(AutoFreezeCriterion, MaxFractionCapsThePrefixAndFrozenLayersCountAsConverged) {
  auto layers = four_layers();
  layers[1].frozen = true;  // frozen by freeze.modules
  AutoFreeze f(layers, 0.1, /*max_fraction=*/0.5);
  f.check({1.0, 0.0, 1.0, 1.0});
  // a converged: frozen (with b, 50%); c converged too but would make 75%.
  EXPECT_EQ(f.check({1.0, 0.0, 1.0, 1.0}), (std::vector<int>{0}));
  EXPECT_FALSE(f.layers()[2].frozen);
}

TEST(AutoFreezeCriterion, ALayerStillChangingEndsThePrefix) {
  AutoFreeze f(four_layers(), 0.1, 1.0);
  f.check({1.0, 1.0, 1.0, 1.0});
  EXPECT_TRUE(f.check({2.0, 1.0, 1.0, 1.0}).empty());  // a changed by 100%: b, c wait behind it
  EXPECT_THROW(f.check({1.0}), std::invalid_argument);
}

// The GPT's embedding layer owns wte, wpe and a dropout: only modules with
// parameters are named (freeze.modules refuses a name that holds none), and
// each layer's count holds a tied tensor once.
TEST(AdaptiveFreezing, LayersNameOnlyModulesWithParameters) {
  TrainConfig c;
  c.model.kind = "gpt";
  c.model.layers = 2;
  c.model.d_model = 16;
  c.model.heads = 2;
  c.model.seq_len = 8;
  c.data.dataset = "text";
  auto model = paratrain::train::make_model(c);
  const auto layers = paratrain::train::freeze_layers(*model, {"wte", "wpe"});
  ASSERT_GE(layers.size(), 3u);
  EXPECT_EQ(layers[0].modules, (std::vector<std::string>{"wte", "wpe"}));
  EXPECT_TRUE(layers[0].frozen);
  EXPECT_FALSE(layers[1].frozen);
  int64_t total = 0;
  for (const auto& l : layers) total += l.numel;
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  EXPECT_EQ(total, numel);
  EXPECT_NO_THROW(paratrain::train::freeze_modules(*model, layers[0].modules));
}

// ---- through the Trainer

// The MLP of freeze_test.cpp (fc0 888, fc1 400, fc2 170 of 1458 elements);
// checks every 4 steps with a threshold every layer meets, capped at 70% of
// the parameters: fc0 (61%) freezes at the second check (step 8), fc1 never
// (88%).
TrainConfig adaptive_config(const std::string& dir, int64_t steps) {
  TrainConfig c = paratrain::testing::small_mlp_config(dir);
  c.train.max_steps = steps;
  c.freeze.adaptive = true;
  c.freeze.check_every_steps = 4;
  c.freeze.threshold = 10.0;
  c.freeze.max_fraction = 0.7;
  return c;
}

struct RunResult {
  Params params;
  std::vector<bool> fc0_frozen_on_rank;
};

RunResult train(const TrainConfig& cfg, int world) {
  RunResult run;
  std::vector<Params> per_rank(world);
  std::vector<char> frozen(world, 0);
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    per_rank[g.rank()] = t.full_parameters();
    for (const auto& p : t.model()->named_parameters())
      if (p.key() == "fc0.weight") frozen[g.rank()] = !p.value().requires_grad();
  });
  run.params = per_rank[0];
  for (int r = 0; r < world; ++r) run.fc0_frozen_on_rank.push_back(frozen[r] != 0);
  return run;
}

double relative_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

std::vector<nlohmann::json> records_of(const std::string& run_dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in(std::filesystem::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == kind) out.push_back(std::move(j));
  }
  return out;
}

at::Tensor saved_tensor(const std::filesystem::path& checkpoint, const std::string& name) {
  return paratrain::checkpoint::ShardedReader(checkpoint).read_whole(name);
}

// Each layer's gradient norm of every check, by step.
std::map<int64_t, std::map<std::string, double>> check_norms(const std::string& run_dir) {
  std::map<int64_t, std::map<std::string, double>> out;
  for (const auto& r : records_of(run_dir, "freeze_check"))
    for (const auto& [layer, v] : r["layers"].items()) out[r["step"].get<int64_t>()][layer] = v["grad_norm"].get<double>();
  return out;
}

TEST(AdaptiveFreezing, EveryRankFreezesTheSamePrefixAtTheSameStepAsOneProcess) {
  auto dir = paratrain::testing::temp_dir("adaptive");
  const RunResult single = train(adaptive_config(dir + "/single", 12), 1);
  EXPECT_TRUE(single.fc0_frozen_on_rank[0]);
  const auto single_norms = check_norms(dir + "/single/t/version_0");
  ASSERT_EQ(single_norms.size(), 2u);
  // The norms each layout measures are the one process's: every element
  // counted once (replicas on one rank, shards on their holders), and the
  // same decision follows on every rank.
  RunResult sharded;
  for (const std::string layout : {"zero2", "ddp", "pp2"}) {
    auto cfg = adaptive_config(dir + "/" + layout, 12);
    if (layout == "zero2") cfg.zero.stage = 2;
    if (layout == "pp2") {
      cfg.parallel.pp = 2;
      cfg.pipeline.split = {1, 2};
      cfg.pipeline.microbatches = 2;
    }
    const RunResult run = train(cfg, 2);
    if (layout == "zero2") sharded = run;
    if (layout != "pp2") {  // a pipeline stage holds only its own layers
      for (bool f : run.fc0_frozen_on_rank) EXPECT_TRUE(f) << layout;
    }
    const double diff = relative_diff(run.params, single.params);
    std::cout << "[adaptive] " << layout << " at 2 ranks vs one process: relative diff " << diff << "\n";
    EXPECT_LT(diff, 1e-5) << layout;
    const auto norms = check_norms(dir + "/" + layout + "/t/version_0");
    ASSERT_EQ(norms.size(), single_norms.size()) << layout;
    for (const auto& [step, layers] : single_norms)
      for (const auto& [layer, norm] : layers)
        EXPECT_NEAR(norms.at(step).at(layer), norm, 1e-5 * norm) << layout << " step " << step << " " << layer;
  }

  // Logged once, at step 8, and fc0 as it was saved then is fc0 at the end.
  const std::string run_dir = dir + "/zero2/t/version_0";
  const auto checks = records_of(run_dir, "freeze_check");
  ASSERT_EQ(checks.size(), 2u);  // steps 4 and 8; none at the last step
  EXPECT_EQ(checks[0]["step"].get<int64_t>(), 4);
  EXPECT_FALSE(checks[0]["layers"]["fc0"].contains("change"));  // the first check only records
  EXPECT_TRUE(checks[1]["layers"]["fc0"].contains("change"));
  EXPECT_GT(checks[1]["layers"]["fc2"]["grad_norm"].get<double>(), 0.0);
  const auto records = records_of(run_dir, "freeze");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["step"].get<int64_t>(), 8);
  EXPECT_EQ(records[0]["layers"], nlohmann::json::array({"fc0"}));
  EXPECT_NEAR(records[0]["frozen_fraction"].get<double>(), 888.0 / 1458.0, 1e-12);
  const auto at8 = std::filesystem::path(run_dir) / "checkpoints" / "step_00000008";
  ASSERT_TRUE(std::filesystem::exists(at8 / "index.json"));
  // Saved as the decision's step, with the frozen set from then on.
  EXPECT_EQ(paratrain::checkpoint::read_index(at8).metadata.at("extra.freeze.modules"), "[\"fc0\"]");
  EXPECT_TRUE(torch::equal(sharded.params[0].second, saved_tensor(at8, "model/fc0.weight")));
  // The control: with adaptive freezing off, fc0 goes on training after step 8.
  auto off = adaptive_config(dir + "/off", 12);
  off.freeze.adaptive = false;
  const RunResult trained = train(off, 1);
  EXPECT_FALSE(torch::equal(trained.params[0].second, saved_tensor(at8, "model/fc0.weight")));
  EXPECT_FALSE(trained.fc0_frozen_on_rank[0]);
}

TEST(AdaptiveFreezing, AResumeAtAnotherWorldSizeKeepsWhatWasFrozen) {
  auto dir = paratrain::testing::temp_dir("adaptive_resume");
  const RunResult uninterrupted = train(adaptive_config(dir + "/full", 16), 1);

  auto first = adaptive_config(dir + "/split", 10);
  train(first, 2);
  const auto at10 = std::filesystem::path(dir) / "split" / "t" / "version_0" / "checkpoints" / "step_00000010";
  ASSERT_TRUE(std::filesystem::exists(at10 / "index.json"));
  EXPECT_EQ(paratrain::checkpoint::read_index(at10).metadata.at("extra.freeze.modules"), "[\"fc0\"]");

  auto resumed = adaptive_config(dir + "/resumed", 16);
  resumed.zero.stage = 3;
  resumed.train.resume = at10.string();
  const RunResult after = train(resumed, 3);
  for (bool f : after.fc0_frozen_on_rank) EXPECT_TRUE(f);
  EXPECT_LT(relative_diff(after.params, uninterrupted.params), 1e-5);
  // From the checkpoint of the decision's step itself.
  const auto at8 = std::filesystem::path(dir) / "split" / "t" / "version_0" / "checkpoints" / "step_00000008";
  auto from8 = adaptive_config(dir + "/from8", 16);
  from8.train.resume = at8.string();
  const RunResult after8 = train(from8, 1);
  EXPECT_TRUE(after8.fc0_frozen_on_rank[0]);
  EXPECT_LT(relative_diff(after8.params, uninterrupted.params), 1e-5);

  // The control: a resume that does not freeze adaptively trains fc0 again.
  auto thawed = adaptive_config(dir + "/thawed", 16);
  thawed.freeze.adaptive = false;
  thawed.train.resume = at10.string();
  EXPECT_GT(relative_diff(train(thawed, 1).params, uninterrupted.params), 1e-4);
}

TEST(AdaptiveFreezing, ConfigErrorsNameWhatToChange) {
  for (const std::string bad : {"ps.servers=1", "elastic.in_job=true", "freeze.max_fraction=0"}) {
    try {
      paratrain::train::config_from_toml_string("", {"freeze.adaptive=true", bad});
      FAIL() << bad;
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("freeze.adaptive"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(paratrain::train::config_from_toml_string("", {"freeze.check_every_steps=0"}), paratrain::ConfigError);
}

}  // namespace

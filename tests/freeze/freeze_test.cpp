// Static layer freezing (freeze.modules) through the whole Trainer under
// every strategy that freezes: frozen tensors stay bitwise as drawn, the
// trainable ones equal one process with the same freezing, the gradient
// traffic shrinks by exactly the frozen share, a frozen pipeline stage runs
// no backward, and checkpoints carry the frozen set across world sizes.
// Each comparison has a control that fails with freezing switched off.
// Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/pipeline/timeline.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/small_mlp.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

// tests/support/small_mlp.h's run, with several FSDP units.
TrainConfig small_config(const std::string& dir) {
  TrainConfig c = paratrain::testing::small_mlp_config(dir);
  c.zero.unit_min_params = 200;
  return c;
}

constexpr int64_t kFc0 = 36 * 24 + 24, kFc1 = 24 * 16 + 16, kFc2 = 16 * 10 + 10;

Params train(const TrainConfig& cfg, int world) {
  std::vector<Params> per_rank(world);
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    per_rank[g.rank()] = t.full_parameters();
  });
  return per_rank[0];
}

Params initial_parameters(const TrainConfig& cfg) {
  Params out;
  for (const auto& item : paratrain::train::seeded_model_factory(cfg, c10::Device(c10::kCPU))()->named_parameters())
    out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

bool frozen_name(const std::string& name) { return name.rfind("fc0.", 0) == 0; }

// max over the trainable tensors of max|a - b| / max|b|.
double trainable_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    if (frozen_name(a[i].first)) continue;
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

void expect_frozen_unchanged(const Params& trained, const Params& initial, const std::string& what) {
  ASSERT_EQ(trained.size(), initial.size());
  int checked = 0;
  for (size_t i = 0; i < trained.size(); ++i) {
    if (!frozen_name(trained[i].first)) continue;
    EXPECT_TRUE(torch::equal(trained[i].second, initial[i].second)) << what << ": " << trained[i].first << " moved";
    ++checked;
  }
  EXPECT_EQ(checked, 2) << what;
}

constexpr double kTolerance = 1e-5;

// ---- configuration

TEST(FreezeConfig, ModulesReadFromAFileAndFromSetInEverySpelling) {
  auto c = paratrain::train::config_from_toml_string("[freeze]\nmodules = [\"fc0\", \"blocks.0\"]\n");
  EXPECT_EQ(c.freeze.modules, (std::vector<std::string>{"fc0", "blocks.0"}));
  for (const std::string set : {"freeze.modules=fc0,blocks.0", "freeze.modules=[fc0, blocks.0]",
                                "freeze.modules=[\"fc0\",\"blocks.0\"]"}) {
    auto d = paratrain::train::config_from_toml_string("", {set});
    EXPECT_EQ(d.freeze.modules, (std::vector<std::string>{"fc0", "blocks.0"})) << set;
  }
  EXPECT_EQ(paratrain::train::config_from_toml_string("", {"freeze.modules=fc1"}).freeze.modules,
            (std::vector<std::string>{"fc1"}));
  EXPECT_TRUE(paratrain::train::config_from_toml_string("", {"freeze.modules=[]"}).freeze.modules.empty());
  // The saved config reads back the same.
  EXPECT_EQ(paratrain::train::config_from_toml_string(paratrain::train::to_toml(c)).freeze.modules, c.freeze.modules);
  for (const std::string bad : {"freeze.modules=fc0,fc0", "freeze.modules=fc0,,fc1", "freeze.modules=.fc0"}) {
    EXPECT_THROW(paratrain::train::config_from_toml_string("", {bad}), paratrain::ConfigError) << bad;
  }
  EXPECT_THROW(paratrain::train::config_from_toml_string("[freeze]\nmodules = \"fc0\"\n"), paratrain::ConfigError);
  EXPECT_THROW(paratrain::train::config_from_toml_string("[freeze]\nmodules = [1]\n"), paratrain::ConfigError);
  // The megatron strategy freezes too (megatron_freeze_test.cpp).
  EXPECT_NO_THROW(paratrain::train::config_from_toml_string(
      "", {"freeze.modules=blocks.0", "parallel.tp=2", "model.kind=gpt", "data.dataset=text"}));
  EXPECT_NO_THROW(paratrain::train::config_from_toml_string(
      "", {"freeze.adaptive=true", "parallel.tp=2", "model.kind=gpt", "data.dataset=text"}));
}

TEST(FreezeConfig, AnUnknownModuleNamesTheModelsModulesAndFreezingEverythingIsRefused) {
  auto dir = paratrain::testing::temp_dir("freeze_names");
  auto cfg = small_config(dir);
  cfg.freeze.modules = {"fc9"};
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    try {
      Trainer t(cfg, g);
      FAIL() << "expected ConfigError";
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("\"fc9\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("fc0, fc1, fc2"), std::string::npos) << e.what();
    }
  });
  cfg.freeze.modules = {"fc0", "fc1", "fc2"};
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    try {
      Trainer t(cfg, g);
      FAIL() << "expected ConfigError";
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("nothing would train"), std::string::npos) << e.what();
    }
  });
  // A prefix must end at a dot: "fc" names no module.
  cfg.freeze.modules = {"fc"};
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    EXPECT_THROW(Trainer(cfg, g), paratrain::ConfigError);
  });
}

// ---- every strategy equals one process with the same freezing

struct Layout {
  std::string name;
  int world;
  std::function<void(TrainConfig&)> apply;
};

class FreezeOracle : public ::testing::TestWithParam<Layout> {};

TEST_P(FreezeOracle, FrozenTensorsStayAsDrawnAndTheRestEqualsOneProcess) {
  const Layout& layout = GetParam();
  auto dir = paratrain::testing::temp_dir("freeze_oracle");
  auto single = small_config(dir + "/single");
  single.ddp.mode = "none";
  single.freeze.modules = {"fc0"};
  const Params oracle = train(single, 1);
  const Params initial = initial_parameters(single);
  expect_frozen_unchanged(oracle, initial, "one process");

  auto cfg = small_config(dir + "/" + layout.name);
  cfg.freeze.modules = {"fc0"};
  layout.apply(cfg);
  const Params trained = train(cfg, layout.world);
  expect_frozen_unchanged(trained, initial, layout.name);
  const double diff = trainable_diff(trained, oracle);
  std::cout << "[freeze] " << layout.name << " on " << layout.world << " ranks: trainable relative diff " << diff
            << " (tolerance " << kTolerance << ")\n";
  EXPECT_LT(diff, kTolerance) << layout.name;

  // The control: the same layout without freezing trains fc0 and ends far
  // from the frozen oracle.
  auto unfrozen = small_config(dir + "/" + layout.name + "_unfrozen");
  layout.apply(unfrozen);
  const Params moved = train(unfrozen, layout.world);
  EXPECT_GT(trainable_diff(moved, oracle), 1e-3) << layout.name;
  EXPECT_FALSE(torch::equal(moved[0].second, initial[0].second)) << layout.name;
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, FreezeOracle,
    ::testing::Values(Layout{"ddp", 2, [](TrainConfig&) {}},
                      Layout{"zero1", 2, [](TrainConfig& c) { c.zero.stage = 1; }},
                      Layout{"zero2", 3, [](TrainConfig& c) { c.zero.stage = 2; }},
                      Layout{"fsdp", 2, [](TrainConfig& c) { c.zero.stage = 3; }},
                      Layout{"ps_sync", 3, [](TrainConfig& c) { c.ps.servers = 1; }},
                      Layout{"pp2", 2,
                             [](TrainConfig& c) {
                               c.parallel.pp = 2;
                               c.pipeline.split = {1, 2};
                               c.pipeline.microbatches = 2;
                             }},
                      Layout{"pp2_zero1", 2,
                             [](TrainConfig& c) {
                               c.parallel.pp = 2;
                               c.pipeline.split = {1, 2};
                               c.pipeline.microbatches = 2;
                               c.zero.stage = 1;
                             }},
                      Layout{"pp2_recompute", 2,
                             [](TrainConfig& c) {
                               c.parallel.pp = 2;
                               c.pipeline.split = {1, 2};
                               c.pipeline.microbatches = 2;
                               c.pipeline.checkpoint_activations = true;
                             }},
                      Layout{"dp2_pp2", 4,
                             [](TrainConfig& c) {
                               c.parallel.pp = 2;
                               c.pipeline.split = {1, 2};
                               c.pipeline.microbatches = 2;
                             }}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// Interleaved 1F1B: 4 one-layer chunks, 2 per rank (chunks 0 and 2 on rank
// 0, 1 and 3 on rank 1). Freezing fc0 freezes chunk 0 alone; fc0 and fc1 a
// prefix that spans both ranks, so rank 1's first chunk sends no gradient back
// and rank 0's second chunk is the first that trains.
TEST(FreezeOracle, InterleavedChunksOfAFrozenPrefixEqualOneProcess) {
  auto dir = paratrain::testing::temp_dir("freeze_interleaved");
  for (const std::vector<std::string>& frozen : {std::vector<std::string>{"fc0"}, {"fc0", "fc1"}}) {
    const std::string name = frozen.size() == 1 ? "one" : "two";
    auto single = small_config(dir + "/single_" + name);
    single.model.hidden = {24, 16, 16};
    single.ddp.mode = "none";
    single.freeze.modules = frozen;
    const Params oracle = train(single, 1);
    auto cfg = small_config(dir + "/interleaved_" + name);
    cfg.model.hidden = {24, 16, 16};
    cfg.freeze.modules = frozen;
    cfg.parallel.pp = 2;
    cfg.pipeline.schedule = "interleaved_1f1b";
    cfg.pipeline.virtual_stages = 2;
    cfg.pipeline.split = {1, 1, 1, 1};
    cfg.pipeline.microbatches = 2;
    const Params trained = train(cfg, 2);
    ASSERT_EQ(trained.size(), oracle.size());
    for (size_t i = 0; i < trained.size(); ++i) {
      const bool is_frozen = trained[i].first.rfind("fc0.", 0) == 0 || (frozen.size() == 2 && trained[i].first.rfind("fc1.", 0) == 0);
      const double scale = std::max(oracle[i].second.abs().max().item<double>(), 1e-12);
      const double diff = (trained[i].second - oracle[i].second).abs().max().item<double>() / scale;
      if (is_frozen) EXPECT_EQ(diff, 0.0) << name << " " << trained[i].first;
      else EXPECT_LT(diff, kTolerance) << name << " " << trained[i].first;
    }
  }
}

// ---- what freezing saves

// Elements all-reduced per step in gradient-sized collectives (the loss and
// metric reductions move a handful), read from each rank's flight recorder.
std::vector<int64_t> gradient_elements_all_reduced(const TrainConfig& cfg, int world) {
  std::vector<int64_t> out(world, 0);
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    auto recorder = std::make_shared<paratrain::comm::FlightRecorder>(g.rank(), 1 << 16);
    std::shared_ptr<paratrain::comm::ProcessGroup> unowned(std::shared_ptr<paratrain::comm::ProcessGroup>(), &g);
    auto recorded = paratrain::comm::record_collectives(unowned, recorder);
    Trainer t(cfg, *recorded);
    t.fit();
    for (const auto& r : recorder->records())
      if (std::string(r.op) == "all_reduce" && r.numel > 16) out[g.rank()] += r.numel;
  });
  return out;
}

TEST(FreezeSaves, DdpAllReducesExactlyTheTrainableGradients) {
  auto dir = paratrain::testing::temp_dir("freeze_bytes");
  auto cfg = small_config(dir + "/unfrozen");
  const auto unfrozen = gradient_elements_all_reduced(cfg, 2);
  cfg = small_config(dir + "/frozen");
  cfg.freeze.modules = {"fc0"};
  const auto frozen = gradient_elements_all_reduced(cfg, 2);
  for (int r = 0; r < 2; ++r) {
    std::cout << "[freeze] rank " << r << " all-reduced " << unfrozen[r] * 4 << " gradient bytes unfrozen, "
              << frozen[r] * 4 << " with fc0 frozen (" << 12 << " steps)\n";
    EXPECT_EQ(unfrozen[r], 12 * (kFc0 + kFc1 + kFc2)) << "rank " << r;
    EXPECT_EQ(frozen[r], 12 * (kFc1 + kFc2)) << "rank " << r;
  }
}

TEST(FreezeSaves, ParameterServerWorkersPushOnlyTheTrainableGradients) {
  auto dir = paratrain::testing::temp_dir("freeze_ps");
  for (bool freeze : {false, true}) {
    auto cfg = small_config(dir + (freeze ? "/frozen" : "/unfrozen"));
    cfg.ps.servers = 1;
    if (freeze) cfg.freeze.modules = {"fc0"};
    train(cfg, 3);
    int workers = 0;
    std::ifstream in(std::filesystem::path(cfg.run.output_dir) / "t" / "version_0" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("kind", "") != "ps_staleness") continue;
      ++workers;
      const int64_t numel = freeze ? kFc1 + kFc2 : kFc0 + kFc1 + kFc2;
      const int64_t messages = j["messages_per_step"].get<int64_t>();
      // Each message: a 3-float header and its ranges' gradients.
      EXPECT_EQ(j["push_bytes"].get<int64_t>(), (numel + 3 * messages) * 4 * 12) << j;
    }
    EXPECT_EQ(workers, 2);
  }
}

// Stage 0 holds fc0 alone: frozen, it runs forward only; stage 1 sends it
// no gradient. Read from the pipeline timeline of two steps.
TEST(FreezeSaves, AFrozenPipelineStageRunsNoBackwardAndReceivesNoGradient) {
  auto dir = paratrain::testing::temp_dir("freeze_pp");
  for (bool freeze : {false, true}) {
    auto cfg = small_config(dir + (freeze ? "/frozen" : "/unfrozen"));
    cfg.parallel.pp = 2;
    cfg.pipeline.split = {1, 2};
    cfg.pipeline.microbatches = 2;
    cfg.pipeline.trace_steps = 2;
    cfg.train.max_steps = 2;
    if (freeze) cfg.freeze.modules = {"fc0"};
    train(cfg, 2);
    const auto run_dir = std::filesystem::path(cfg.run.output_dir) / "t" / "version_0";
    std::map<std::string, int> stage0, stage1;
    for (const auto& e : paratrain::pipeline::read_rank_timeline(paratrain::pipeline::timeline_path(run_dir, 0)).events)
      ++stage0[paratrain::pipeline::to_string(e.kind)];
    for (const auto& e : paratrain::pipeline::read_rank_timeline(paratrain::pipeline::timeline_path(run_dir, 1)).events)
      ++stage1[paratrain::pipeline::to_string(e.kind)];
    EXPECT_EQ(stage0["forward"], 4);
    EXPECT_EQ(stage1["backward"], 4);
    EXPECT_EQ(stage0["backward"], freeze ? 0 : 4);
    EXPECT_EQ(stage0["recv"], freeze ? 0 : 4);  // gradients from stage 1
    EXPECT_EQ(stage1["send"], freeze ? 0 : 4);
  }
}

// ---- checkpoints

TEST(FreezeCheckpoints, AFrozenRunSavedAtTwoRanksResumesAtThreeAndAtOneAsTheUninterruptedRun) {
  auto dir = paratrain::testing::temp_dir("freeze_resume");
  auto full = small_config(dir + "/full");
  full.ddp.mode = "none";
  full.freeze.modules = {"fc0"};
  const Params uninterrupted = train(full, 1);

  auto first = small_config(dir + "/split");
  first.freeze.modules = {"fc0"};
  first.zero.stage = 2;
  first.train.max_steps = 6;
  train(first, 2);
  const auto ckpt = std::filesystem::path(dir) / "split" / "t" / "version_0" / "checkpoints" / "step_00000006";
  ASSERT_TRUE(std::filesystem::exists(ckpt / "index.json"));
  const auto index = paratrain::checkpoint::read_index(ckpt);
  EXPECT_EQ(index.metadata.at("extra.freeze.modules"), "[\"fc0\"]");
  EXPECT_TRUE(index.tensors.count("model/fc0.weight"));           // frozen values are saved
  EXPECT_FALSE(index.tensors.count("optimizer/fc0.weight/exp_avg"));  // with no optimizer state

  auto fsdp = small_config(dir + "/fsdp3");
  fsdp.freeze.modules = {"fc0"};
  fsdp.zero.stage = 3;
  fsdp.train.resume = ckpt.string();
  EXPECT_LT(trainable_diff(train(fsdp, 3), uninterrupted), kTolerance);

  auto one = small_config(dir + "/one");
  one.ddp.mode = "none";
  one.freeze.modules = {"fc0"};
  one.train.resume = ckpt.string();
  const Params resumed = train(one, 1);
  EXPECT_LT(trainable_diff(resumed, uninterrupted), kTolerance);
  expect_frozen_unchanged(resumed, initial_parameters(full), "resumed at one process");

  // Unfreezing on resume: fc0 starts training from its saved values, with
  // fresh optimizer state.
  auto thawed = small_config(dir + "/thawed");
  thawed.ddp.mode = "none";
  thawed.train.resume = ckpt.string();
  const Params after = train(thawed, 1);
  EXPECT_FALSE(torch::equal(after[0].second, uninterrupted[0].second));
  EXPECT_GT(trainable_diff(after, uninterrupted), 1e-4);
}

}  // namespace

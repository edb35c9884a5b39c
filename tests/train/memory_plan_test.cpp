// Tests of train/memory_plan (the ZeRO planner behind `paratrain plan`): Ψ
// against the built model, the per-stage formulas for a known Ψ and N, the
// fit decision, the JSON shape, and the CLI end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace pt = paratrain::train;

namespace {

int64_t built_count(const pt::TrainConfig& c) {
  int64_t n = 0;
  for (const auto& p : pt::make_model(c)->parameters()) n += p.numel();
  return n;
}

constexpr int64_t kPsi = 235146;  // MLP 784-256-128-10: 784*256+256 + 256*128+128 + 128*10+10

TEST(MemoryPlan, ParameterCountMatchesTheBuiltModel) {
  pt::TrainConfig mlp;
  EXPECT_EQ(pt::parameter_count(mlp), kPsi);
  EXPECT_EQ(built_count(mlp), kPsi);
  auto cnn = pt::config_from_toml_string("[model]\nkind = \"cnn\"\nchannels = [8, 16, 4]\ncnn_hidden = 24\n");
  EXPECT_EQ(pt::parameter_count(cnn), built_count(cnn));
  auto synthetic = pt::config_from_toml_string(
      "[data]\ndataset = \"synthetic\"\nsynthetic_channels = 3\nsynthetic_image_size = 9\nsynthetic_classes = 7\n"
      "[model]\nhidden = []\n");
  EXPECT_EQ(pt::parameter_count(synthetic), 3 * 9 * 9 * 7 + 7);
  EXPECT_EQ(pt::parameter_count(synthetic), built_count(synthetic));
  synthetic.model.kind = "cnn";
  EXPECT_EQ(pt::parameter_count(synthetic), built_count(synthetic));
}

// Note [ZeRO memory formulas] in memory_plan.cpp, with Ψ = 235,146 and N = 4:
// ceil(Ψ/4) = 58,787 (Ψ/4 = 58,786.5 rounds up).
// Under parallel.tp and pp the GPT's Ψ is what its fullest rank holds: its
// stage's layers, each a tensor-parallel shard. Checked against real
// Trainers (counted from each rank's module): tp 2, tp 4, pp 2, pp 2 x tp 2,
// pp 2 with 2 virtual stages.
TEST(MemoryPlan, UnderTensorAndPipelineParallelismPsiIsWhatTheFullestRankHolds) {
  const auto dir = paratrain::testing::temp_dir("plan_tp");
  const auto corpus = paratrain::testing::write_word_corpus(dir + "/text", 7);
  struct Layout {
    int64_t tp, pp, virtual_stages;
  };
  for (const Layout l : {Layout{2, 1, 1}, Layout{4, 1, 1}, Layout{1, 2, 1}, Layout{2, 2, 1}, Layout{1, 2, 2}}) {
    const std::string tag = fmt::format("tp{}_pp{}_v{}", l.tp, l.pp, l.virtual_stages);
    pt::TrainConfig c = paratrain::testing::tiny_gpt_config(dir + "/" + tag, corpus);
    c.parallel.tp = l.tp;
    c.parallel.pp = l.pp;
    c.pipeline.virtual_stages = l.virtual_stages;
    if (l.virtual_stages > 1) c.pipeline.schedule = "interleaved_1f1b";
    c.train.max_steps = 1;
    const int world = static_cast<int>(l.tp * l.pp);
    std::vector<int64_t> held(static_cast<size_t>(world), 0);
    paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
      pt::Trainer t(c, g);
      int64_t n = 0;
      for (const auto& p : t.model()->parameters()) n += p.numel();
      held[static_cast<size_t>(g.rank())] = n;
    });
    const int64_t fullest = *std::max_element(held.begin(), held.end());
    EXPECT_EQ(pt::parameters_per_rank(c), fullest) << tag;
    const auto plan = pt::plan_memory(c, pt::PlanOptions{});
    EXPECT_EQ(plan.parameters, fullest) << tag;
    EXPECT_EQ(plan.whole_parameters, pt::parameter_count(c)) << tag;
    EXPECT_LT(plan.parameters, plan.whole_parameters) << tag << ": the share is not smaller";
  }
}

TEST(MemoryPlan, StagesFollowTheFormulasForAdam) {
  const auto p = pt::plan_memory(kPsi, 4, 8, 0);
  ASSERT_EQ(p.stages.size(), 4u);
  EXPECT_EQ(p.shard_elements, 58787);
  const int64_t psi = kPsi, shard = 58787;
  // fp32: params 4Ψ, grads 4Ψ, Adam state 8Ψ, sharded stage by stage.
  const int64_t fp32[4][3] = {{4 * psi, 4 * psi, 8 * psi},
                              {4 * psi, 4 * psi, 8 * shard},
                              {4 * psi, 4 * shard, 8 * shard},
                              {4 * shard, 4 * shard, 8 * shard}};
  for (int s = 0; s < 4; ++s) {
    const auto& m = p.stages[s];
    EXPECT_EQ(m.params_bytes, fp32[s][0]) << s;
    EXPECT_EQ(m.grads_bytes, fp32[s][1]) << s;
    EXPECT_EQ(m.optimizer_bytes, fp32[s][2]) << s;
    EXPECT_EQ(m.total_bytes, fp32[s][0] + fp32[s][1] + fp32[s][2]) << s;
  }
  EXPECT_EQ(p.stages[0].total_bytes, 3762336);  // 16Ψ
  // The paper's mixed-precision Adam: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.
  EXPECT_EQ(p.stages[0].mixed_total_bytes, 16 * psi);
  EXPECT_EQ(p.stages[1].mixed_total_bytes, 4 * psi + 12 * shard);
  EXPECT_EQ(p.stages[2].mixed_total_bytes, 2 * psi + 14 * shard);
  EXPECT_EQ(p.stages[3].mixed_total_bytes, 16 * shard);
  // N = 1: nothing to shard, every stage holds everything.
  const auto one = pt::plan_memory(kPsi, 1, 8, 0);
  for (const auto& m : one.stages) EXPECT_EQ(m.total_bytes, 16 * psi);
}

TEST(MemoryPlan, OptimizerStateFollowsTheConfiguredOptimizer) {
  pt::TrainConfig c;  // SGD with momentum 0.9
  EXPECT_EQ(pt::plan_memory(c, {.world = 2}).state_bytes_per_param, 4);
  c.optimizer.momentum = 0;
  const auto plain = pt::plan_memory(c, {.world = 2});
  EXPECT_EQ(plain.state_bytes_per_param, 0);
  EXPECT_EQ(plain.stages[1].total_bytes, plain.stages[0].total_bytes);  // nothing to shard at stage 1
  c.optimizer.kind = "adamw";
  EXPECT_EQ(pt::plan_memory(c, {.world = 2}).state_bytes_per_param, 8);
}

TEST(MemoryPlan, TheLowestStageThatFitsIsNamedOrTheRanksThatWouldFit) {
  const double mib = 1.0 / 1024;  // in GiB
  // Adam, N = 4: stage totals 3.59 MiB, 2.27 MiB, 1.38 MiB, 0.90 MiB.
  auto p = pt::plan_memory(kPsi, 4, 8, 2.5 * mib);
  EXPECT_EQ(p.lowest_fitting_stage, 1);
  EXPECT_FALSE(p.stages[0].fits);
  EXPECT_TRUE(p.stages[1].fits);
  EXPECT_TRUE(p.stages[3].fits);
  EXPECT_NE(pt::format_plan(p).find("stage 1 is the lowest stage that fits"), std::string::npos)
      << pt::format_plan(p);
  p = pt::plan_memory(kPsi, 4, 8, 4 * mib);
  EXPECT_EQ(p.lowest_fitting_stage, 0);
  // 0.5 MiB fits nothing on 4 ranks; stage 3 needs 16 * ceil(Ψ/N) <= 524,288 bytes: N >= 8.
  p = pt::plan_memory(kPsi, 4, 8, 0.5 * mib);
  EXPECT_EQ(p.lowest_fitting_stage, -1);
  EXPECT_EQ(p.dp_needed_for_stage3, 8);
  EXPECT_LE(pt::plan_memory(kPsi, 8, 8, 0.5 * mib).stages[3].total_bytes, 524288);
  EXPECT_GT(pt::plan_memory(kPsi, 7, 8, 0.5 * mib).stages[3].total_bytes, 524288);
  EXPECT_NE(pt::format_plan(p).find("no stage fits on 4 ranks"), std::string::npos) << pt::format_plan(p);
  EXPECT_NE(pt::format_plan(p).find("at least 8 data-parallel ranks"), std::string::npos);
  EXPECT_THROW(pt::plan_memory(kPsi, 4, 8, -1), paratrain::ConfigError);
  pt::TrainConfig c;
  EXPECT_THROW(pt::plan_memory(c, {.world = -1}), paratrain::ConfigError);
  EXPECT_EQ(pt::plan_memory(c, {}).dp, 1);  // no world given: the config's, here one rank
  c.parallel.dp = 3;
  EXPECT_EQ(pt::plan_memory(c, {}).dp, 3);
  EXPECT_THROW(pt::plan_memory(c, {.world = 4}), paratrain::ConfigError);  // dp 3 != 4
}

TEST(MemoryPlan, JsonHasExactBytesPerStage) {
  const auto j = pt::plan_to_json(pt::plan_memory(kPsi, 4, 8, 2.5 / 1024));
  EXPECT_EQ(j["parameters"], kPsi);
  EXPECT_EQ(j["dp"], 4);
  EXPECT_EQ(j["shard_elements"], 58787);
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["lowest_fitting_stage"], 1);
  ASSERT_EQ(j["stages"].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    const auto& row = j["stages"][s];
    EXPECT_EQ(row["stage"], s);
    for (const char* key : {"params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes", "fits"})
      EXPECT_TRUE(row.contains(key)) << key;
    EXPECT_TRUE(row["mixed_precision_adam"].contains("total_bytes"));
  }
  EXPECT_EQ(j["stages"][3]["mixed_precision_adam"]["total_bytes"], 16 * 58787);
  EXPECT_EQ(j["stages"][2]["total_bytes"], 4 * kPsi + 12 * 58787);
}

TEST(PlanCli, PrintsTheTableForTheShippedConfig) {
  auto r = paratrain::testing::run_cli({"plan", "-c", std::string(PARATRAIN_SOURCE_DIR) + "/configs/fashion_mnist_mlp.toml",
                                        "--world", "4", "--set", "optimizer.kind=adam", "--memory-gb", "0.004"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* text : {"mlp 784-256-128-10 with Ψ = 235,146 parameters", "optimizer adam (K = 8",
                           "N = 4 data-parallel ranks", "ceil(Ψ/N) = 58,787", "3.6 MiB",
                           "stage 2 is the lowest stage that fits", "mixed-precision Adam"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << " missing from:\n" << r.output;
  }
  r = paratrain::testing::run_cli({"plan", "-c", std::string(PARATRAIN_SOURCE_DIR) + "/configs/fashion_mnist_mlp.toml",
                                   "--world", "4", "--set", "optimizer.kind=adam", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["stages"][0]["total_bytes"], 16 * kPsi);
  EXPECT_FALSE(j.contains("lowest_fitting_stage"));  // no budget given
  r = paratrain::testing::run_cli({"plan", "-c", std::string(PARATRAIN_SOURCE_DIR) + "/configs/fashion_mnist_mlp.toml",
                                   "--world", "-2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--world -2 must be a positive multiple"), std::string::npos) << r.output;
}

}  // namespace

namespace {

nlohmann::json measured_plan(const std::vector<std::string>& sets) {
  std::vector<std::string> args = {"plan", "-c", std::string(PARATRAIN_SOURCE_DIR) + "/configs/fashion_mnist_mlp.toml",
                                   "--world", "2", "--measure", "--json"};
  for (const auto& kv : sets) args.insert(args.end(), {"--set", kv});
  auto r = paratrain::testing::run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output.substr(r.output.find('{')));
}

}  // namespace

TEST(PlanCli, MeasuresEachRanksPeakNearThePrediction) {
  // Two real processes train the README's MLP for 3 steps; each counts its
  // tensor bytes at LibTorch's allocator (core/memory_meter.h).
  const auto small = measured_plan({"data.batch_size=64"});
  const auto& m = small["measured"];
  ASSERT_EQ(m["ranks"].size(), 2u);
  for (const auto& rank : m["ranks"]) EXPECT_GT(rank["training_peak_bytes"].get<int64_t>(), 0);
  EXPECT_NEAR(m["measured_over_predicted"].get<double>(), 1.0, 0.1) << m.dump();
  // The control: 8x the batch, and the measured peak grows by what the
  // plan says the activations and the loader grow by.
  const auto large = measured_plan({"data.batch_size=512"});
  const double predicted_growth = large["measured"]["predicted_bytes"].get<double>() - m["predicted_bytes"].get<double>();
  const double measured_growth = large["measured"]["peak_bytes"].get<double>() - m["peak_bytes"].get<double>();
  EXPECT_GT(predicted_growth, 1e6);
  EXPECT_NEAR(measured_growth / predicted_growth, 1.0, 0.1) << "predicted +" << predicted_growth << ", measured +"
                                                            << measured_growth;
}

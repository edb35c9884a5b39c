// The pipeline strategy through the whole Trainer (config -> mesh -> stages
// -> schedule -> sharded checkpoints) against the single-process oracle:
// every schedule, p = 2 and 4, m in {1, p-1, p, 2p+1}, pipeline x data
// parallel, activation checkpointing, checkpoints re-cut across pp, and
// pipeline.balance = "rank_speed" (a slower stage gets fewer layers).
// Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

// 8 layers (any pp * virtual_stages up to 8); a global batch of 180 makes
// micro-batches of every size the tests ask for (1, 2, 3, 4, 5, 9).
TrainConfig deep_config(const std::string& dir, const std::string& optimizer = "sgd") {
  TrainConfig c;
  c.run.name = "t";
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
  c.optimizer.kind = optimizer;
  c.optimizer.lr = optimizer == "sgd" ? 0.05 : 0.003;
  c.optimizer.momentum = optimizer == "sgd" ? 0.9 : 0.0;
  c.train.epochs = 1;
  // Adam on this 8-layer net magnifies float-order noise in near-zero
  // gradients beyond ~8 steps (issue 23): compared with one process at 6.
  c.train.max_steps = optimizer == "sgd" ? 10 : 6;
  c.train.eval_every_epochs = 0;
  c.pipeline.trace_steps = 0;
  return c;
}

TrainConfig pipelined(TrainConfig c, int pp, const std::string& schedule, int m, int v = 1) {
  c.parallel.pp = pp;
  c.pipeline.schedule = schedule;
  c.pipeline.microbatches = m;
  c.pipeline.virtual_stages = v;
  return c;
}

// Trains `cfg` on `world` thread-ranks; returns rank 0's full parameters
// (gathered from every stage) and checks that every rank returns the same.
Params train(const TrainConfig& cfg, int world) {
  std::vector<Params> per_rank(world);
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    per_rank[g.rank()] = t.full_parameters();
  });
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(per_rank[0].size(), per_rank[r].size());
    for (size_t i = 0; i < per_rank[0].size() && i < per_rank[r].size(); ++i) {
      EXPECT_TRUE(torch::equal(per_rank[0][i].second, per_rank[r][i].second))
          << "rank " << r << " differs from rank 0 on " << per_rank[0][i].first;
    }
  }
  return per_rank[0];
}

// max over tensors of max|a - b| / max|b|.
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

// The pipeline sums micro-batch gradients (each a mean over its rows,
// weighted by its share) where one process takes one mean over the batch:
// the same numbers added in another order, a few ulps per step. Ten steps of
// momentum SGD stay far below 1e-5 relative; a pipeline that dropped or
// mis-scaled a micro-batch, or skipped a stage's update, is off by > 1e-3
// (the negative controls below).
constexpr double kTolerance = 1e-5;

const Params& single_process(const std::string& optimizer = "sgd") {
  static std::map<std::string, Params> cache;
  auto it = cache.find(optimizer);
  if (it != cache.end()) return it->second;
  auto cfg = deep_config(paratrain::testing::temp_dir("pp_single"), optimizer);
  cfg.ddp.mode = "none";
  return cache[optimizer] = train(cfg, 1);
}

struct Case {
  int pp;
  std::string schedule;
  int m;
  int v;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& c = info.param;
  auto s = c.schedule + "_pp" + std::to_string(c.pp) + "_m" + std::to_string(c.m) + "_v" + std::to_string(c.v);
  for (auto& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int p : {2, 4}) {
    for (int m : {1, p - 1, p, 2 * p + 1}) {
      if (m == 1 && p == 2 && !out.empty()) continue;  // p - 1 == 1
      out.push_back({p, "gpipe", m, 1});
      out.push_back({p, "1f1b", m, 1});
    }
    // Interleaving needs m % p == 0 (as in Megatron-LM).
    out.push_back({p, "interleaved_1f1b", p, 2});
  }
  out.push_back({2, "interleaved_1f1b", 4, 2});
  out.push_back({2, "interleaved_1f1b", 2, 3});
  return out;
}

class PipelineOracle : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineOracle, EqualsOneProcess) {
  const Case c = GetParam();
  auto cfg = pipelined(deep_config(paratrain::testing::temp_dir("pp")), c.pp, c.schedule, c.m, c.v);
  const double diff = relative_diff(train(cfg, c.pp), single_process());
  EXPECT_LT(diff, kTolerance);
  std::printf("[ measured ] %s pp=%d m=%d v=%d: relative diff to 1 process %.3g\n", c.schedule.c_str(), c.pp, c.m,
              c.v, diff);
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineOracle, ::testing::ValuesIn(cases()), case_name);

// The schedules only reorder the same per-micro-batch work, and every stage
// accumulates a parameter's micro-batch gradients in micro-batch order: the
// three schedules give bitwise the same model.
TEST(PipelineSchedules, GpipeEquals1F1BEqualsInterleaved) {
  auto dir = paratrain::testing::temp_dir("pp_same");
  const auto gpipe = train(pipelined(deep_config(dir + "/g"), 2, "gpipe", 4), 2);
  const auto one = train(pipelined(deep_config(dir + "/o"), 2, "1f1b", 4), 2);
  const auto inter = train(pipelined(deep_config(dir + "/i"), 2, "interleaved_1f1b", 4, 2), 2);
  EXPECT_EQ(relative_diff(one, gpipe), 0.0);
  EXPECT_EQ(relative_diff(inter, gpipe), 0.0);
}

TEST(PipelineDataParallel, TwoStagesTimesTwoReplicasEqualsOneProcess) {
  auto dir = paratrain::testing::temp_dir("pp_dp");
  for (const std::string mode : {"bucketed", "naive"}) {
    auto cfg = pipelined(deep_config(dir + "/" + mode, "adam"), 2, "1f1b", 3);
    cfg.ddp.mode = mode;
    const double diff = relative_diff(train(cfg, 4), single_process("adam"));
    EXPECT_LT(diff, kTolerance) << "ddp.mode " << mode;
    std::printf("[ measured ] pp=2 x dp=2 (%s): relative diff to 1 process %.3g\n", mode.c_str(), diff);
  }
}

// ZeRO-1/2 on the dp axis of each stage: every chunk's optimizer state (and
// with stage 2 its gradients) sharded over the stage's replicas. Also with
// interleaving (two ZeRO instances under one optimizer) and with clipping
// (the norm summed over shards and stages).
TEST(PipelineZero, StagesOneAndTwoOverReplicasEqualOneProcess) {
  auto dir = paratrain::testing::temp_dir("pp_zero");
  for (int stage : {1, 2}) {
    auto cfg = pipelined(deep_config(dir + "/z" + std::to_string(stage), "adam"), 2, "1f1b", 3);
    cfg.zero.stage = stage;
    const double diff = relative_diff(train(cfg, 4), single_process("adam"));
    EXPECT_LT(diff, kTolerance) << "zero.stage " << stage;
    std::printf("[ measured ] pp=2 x dp=2 ZeRO-%d: relative diff to 1 process %.3g\n", stage, diff);
  }
  auto clipped_single = deep_config(dir + "/clip1", "adam");
  clipped_single.ddp.mode = "none";
  clipped_single.optimizer.clip_grad_norm = 0.05;
  const auto reference = train(clipped_single, 1);
  auto clipped = pipelined(deep_config(dir + "/clip4", "adam"), 2, "interleaved_1f1b", 2, 2);
  clipped.optimizer.clip_grad_norm = 0.05;
  clipped.zero.stage = 2;
  const double diff = relative_diff(train(clipped, 4), reference);
  EXPECT_LT(diff, kTolerance);
  // Negative control: the clipping really bites at 0.05.
  EXPECT_GT(relative_diff(reference, single_process("adam")), 1e-3);
  std::printf("[ measured ] pp=2 x dp=2 interleaved ZeRO-2 clipped: relative diff to 1 process %.3g\n", diff);
}

// A pp x dp ZeRO-2 checkpoint (each replica writes its shard pieces) resumes
// as one process and continues like the uninterrupted run.
TEST(PipelineZero, CheckpointResumesAsOneProcess) {
  auto dir = paratrain::testing::temp_dir("pp_zero_ckpt");
  auto first = pipelined(deep_config(dir + "/run", "adam"), 2, "1f1b", 2);
  first.zero.stage = 2;
  first.train.max_steps = 3;
  first.train.checkpoint_every_steps = 3;
  train(first, 4);
  auto resumed = deep_config(dir + "/run", "adam");
  resumed.ddp.mode = "none";
  resumed.train.resume = (std::filesystem::path(dir) / "run" / "t" / "version_0" / "checkpoints" / "step_00000003").string();
  const double diff = relative_diff(train(resumed, 1), single_process("adam"));
  EXPECT_LT(diff, kTolerance);
  std::printf("[ measured ] pp=2 x dp=2 ZeRO-2 checkpoint resumed as 1 process: %.3g\n", diff);
}

TEST(PipelineActivationCheckpointing, EqualsWithout) {
  auto dir = paratrain::testing::temp_dir("pp_ckpt");
  for (const std::string schedule : {"1f1b", "interleaved_1f1b"}) {
    const int v = schedule == "1f1b" ? 1 : 2;
    auto plain = pipelined(deep_config(dir + "/p" + schedule), 2, schedule, 6, v);
    auto recompute = pipelined(deep_config(dir + "/r" + schedule), 2, schedule, 6, v);
    recompute.pipeline.checkpoint_activations = true;
    // 2 stages x 2 replicas: recomputation under DDP's hooks too.
    auto plain_dp = plain, recompute_dp = recompute;
    plain_dp.run.name = recompute_dp.run.name = "dp";
    EXPECT_EQ(relative_diff(train(recompute, 2), train(plain, 2)), 0.0) << schedule;
    EXPECT_EQ(relative_diff(train(recompute_dp, 4), train(plain_dp, 4)), 0.0) << schedule << " with dp = 2";
  }
}

TEST(PipelineOracle, NegativeControlsAreFarFromTheOracle) {
  auto dir = paratrain::testing::temp_dir("pp_neg");
  // Only one micro-batch's worth of the batch: what a pipeline that dropped
  // the other micro-batches would train.
  auto quarter = deep_config(dir + "/quarter");
  quarter.ddp.mode = "none";
  quarter.data.global_batch_size = 45;
  EXPECT_GT(relative_diff(train(quarter, 1), single_process()), 1e-3);
  // Two replicas that never exchange gradients: each steps on half the batch.
  auto half = deep_config(dir + "/half");
  half.ddp.mode = "none";
  half.data.global_batch_size = 90;
  EXPECT_GT(relative_diff(train(half, 1), single_process()), 1e-3);
}

// Saved at pp = 4 (1F1B), resumed at pp = 2 (interleaved) and as one
// process: each continued run equals the uninterrupted single process.
TEST(PipelineCheckpoints, ResumeAtAnotherPipelineDepthAndAsOneProcess) {
  auto dir = paratrain::testing::temp_dir("pp_reshard");
  auto first = pipelined(deep_config(dir + "/run"), 4, "1f1b", 4);
  first.train.max_steps = 4;
  first.train.checkpoint_every_steps = 4;
  train(first, 4);

  auto resumed_pp = pipelined(deep_config(dir + "/run"), 2, "interleaved_1f1b", 2, 2);
  resumed_pp.train.resume = "auto";
  resumed_pp.run.name = "t";
  const double d_pp = relative_diff(train(resumed_pp, 2), single_process());
  EXPECT_LT(d_pp, kTolerance);

  auto resumed_one = deep_config(dir + "/run");
  std::filesystem::remove_all(std::filesystem::path(dir) / "run" / "t" / "version_0" / "checkpoints" / "step_00000010");
  resumed_one.ddp.mode = "none";
  resumed_one.train.resume = (std::filesystem::path(dir) / "run" / "t" / "version_0" / "checkpoints" / "step_00000004").string();
  const double d_one = relative_diff(train(resumed_one, 1), single_process());
  EXPECT_LT(d_one, kTolerance);
  std::printf("[ measured ] pp=4 checkpoint resumed at pp=2: %.3g, as 1 process: %.3g\n", d_pp, d_one);
}

TEST(PipelineConfig, InvalidCombinationsNameTheKeys) {
  auto dir = paratrain::testing::temp_dir("pp_bad");
  auto expect_error = [&](TrainConfig cfg, int world, const std::string& needle) {
    try {
      paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) { Trainer t(cfg, g); });
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // 7 micro-batches do not divide the batch of 180.
  expect_error(pipelined(deep_config(dir), 2, "1f1b", 7), 2, "pipeline.microbatches = 7");
  // 8 layers cannot make 4 stages x 3 chunks.
  expect_error(pipelined(deep_config(dir), 4, "interleaved_1f1b", 4, 3), 4, "layers");
  // Interleaving needs m % pp == 0.
  expect_error(pipelined(deep_config(dir), 2, "interleaved_1f1b", 3, 2), 2, "pipeline.microbatches");
  auto zero3 = pipelined(deep_config(dir), 2, "1f1b", 2);
  zero3.zero.stage = 3;
  expect_error(zero3, 2, "zero.stage = 3");
  auto split = pipelined(deep_config(dir), 2, "1f1b", 2);
  split.pipeline.split = {5, 2};
  expect_error(split, 2, "pipeline.split");
  EXPECT_THROW(paratrain::train::config_from_toml_string("[pipeline]\nschedule = \"interleaved_1f1b\"\n"),
               paratrain::ConfigError);
}

TEST(PipelineConfig, ExplicitSplitAndTimeBalanceTrainTheSameModel) {
  auto dir = paratrain::testing::temp_dir("pp_split");
  auto split = pipelined(deep_config(dir + "/s"), 2, "1f1b", 4);
  split.pipeline.split = {6, 2};
  EXPECT_LT(relative_diff(train(split, 2), single_process()), kTolerance);
  auto timed = pipelined(deep_config(dir + "/t"), 2, "gpipe", 4);
  timed.pipeline.balance = "time";
  EXPECT_LT(relative_diff(train(timed, 2), single_process()), kTolerance);
}

}  // namespace

namespace {

// The CNN's layers (conv blocks, fc0, fc1) are cut like the MLP's.
TEST(PipelineModels, CnnStagesEqualOneProcess) {
  auto dir = paratrain::testing::temp_dir("pp_cnn");
  auto cnn = [&](const std::string& name) {
    auto c = deep_config(dir + "/" + name);
    c.model.kind = "cnn";
    c.model.channels = {4, 6};
    c.model.cnn_hidden = 16;
    c.data.synthetic_image_size = 8;
    c.data.global_batch_size = 36;
    c.data.synthetic_train_size = 360;
    c.train.max_steps = 6;
    return c;
  };
  auto single_cfg = cnn("single");
  single_cfg.ddp.mode = "none";
  const auto single = train(single_cfg, 1);
  const double two = relative_diff(train(pipelined(cnn("pp2"), 2, "1f1b", 3), 2), single);
  const double four = relative_diff(train(pipelined(cnn("pp4"), 4, "gpipe", 2), 4), single);
  EXPECT_LT(two, kTolerance);
  EXPECT_LT(four, kTolerance);
  std::printf("[ measured ] CNN pp=2 1f1b m=3: %.3g, pp=4 gpipe m=2: %.3g\n", two, four);
}

}  // namespace

namespace {

// precision.compute = "bf16" through the pipeline. Oracle: one process with
// the same micro-batch arithmetic (train.accumulate = m, batch / m each) under
// the same autocast (global batch 180 either way). Widening a bf16 activation to fp32 at a stage boundary
// and narrowing it in the next chunk is exact, and so is the gradient's way
// back, so the pipeline computes the one-process numbers; the tolerance is
// the summation-order one of the fp32 tests. Negative control: the fp32
// pipeline is far from the bf16 oracle (autocast really ran).
TEST(PipelinePrecision, Bf16StagesEqualOneProcessBf16) {
  auto dir = paratrain::testing::temp_dir("pp_bf16");
  auto one = deep_config(dir + "/one");
  one.ddp.mode = "none";
  one.precision.compute = "bf16";
  one.train.accumulate = 4;
  auto pp = pipelined(deep_config(dir + "/pp"), 2, "1f1b", 4);
  pp.precision.compute = "bf16";
  auto pp_fp32 = pipelined(deep_config(dir + "/pp32"), 2, "1f1b", 4);
  const auto oracle = train(one, 1);
  const double d = relative_diff(train(pp, 2), oracle);
  const double control = relative_diff(train(pp_fp32, 2), oracle);
  std::printf("[ measured ] bf16 pp=2 1f1b m=4 vs 1 process bf16 (accumulate 4): %.3g; fp32 pipeline: %.3g\n", d,
              control);
  EXPECT_LT(d, kTolerance);
  EXPECT_GT(control, 1e-4);
}

// Layers per stage from a checkpoint's pipeline.layer_bounds ("0,6,8").
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

// pipeline.balance = "rank_speed" (Note [Stages by rank speed] in
// paratrain/train/strategies/pipeline_parts.cpp): chunk j's cost is scaled
// by its stage's slowness: a 3x slower second stage gets a quarter of
// uniform layers; scales of 1 change nothing.
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
  auto c = pipelined(deep_config(paratrain::testing::temp_dir("rank_speed")), 2, "1f1b", 4);
  c.pipeline.balance = "rank_speed";
  c.profile.test_slow_rank = 1;
  c.profile.test_slow_factor = 3;
  std::filesystem::path checkpoint;
  Params ranks;
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(c, g);
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
  const double diff = relative_diff(ranks, single_process());
  std::printf("rank_speed pipeline vs one process after 10 SGD steps: %.2e\n", diff);
  EXPECT_LT(diff, kTolerance);

  TrainConfig gpt;
  for (const char* set : {"model.kind=gpt", "data.dataset=text", "parallel.pp=2", "parallel.tp=2",
                          "pipeline.balance=rank_speed"})
    paratrain::train::apply_override(gpt, set);
  try {
    paratrain::train::validate_config(gpt);
    ADD_FAILURE() << "rank_speed under the megatron strategy was accepted";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_speed applies to the pipeline strategy"), std::string::npos) << e.what();
  }
}

}  // namespace

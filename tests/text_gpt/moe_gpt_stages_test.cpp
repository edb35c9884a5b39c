// A mixture-of-experts GPT in pipeline stages: the MoE layers of each
// stage route each pipeline micro-batch as one process's accumulated
// micro-batch; with parallel.ep their experts split over each stage's
// replicas (Note [Experts in pipeline stages]), in the pipeline strategy
// and in the megatron strategy's stages with tp inside.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/memory_plan.h"
#include "tests/text_gpt/moe_gpt_runs.h"

namespace paratrain::train {
namespace {

using namespace moe_gpt;

// Pipeline stages (parallel.pp, the pipeline strategy): with both blocks
// MoE layers, the first stage's never sees the loss, so its aux loss gets
// its gradient inside the layer (Note [Aux losses in backward]), weighted by
// each pipeline micro-batch's share. A pipeline micro-batch routes its own
// tokens, as one process's accumulated micro-batch does: pp 2, pp 2 x dp 2,
// and the megatron strategy's stages (pp 2 x dp 2 with ZeRO-1, pp 2 x tp 2)
// with 2 micro-batches equal one process with train.accumulate = 2, with
// drops and the aux loss on.
TEST(MoeGptTrainer, PipelineStagesEqualOneProcessOnTheSameMicroBatches) {
  const std::string dir = paratrain::testing::temp_dir("moe-gpt-pp");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 5);
  auto config = [&](const std::string& name, int64_t pp, int64_t accumulate) {
    TrainConfig c = moe_config(dir, corpus, name);
    c.model.moe_every = 1;  // both blocks: one on each stage
    c.train.accumulate = accumulate;
    c.parallel.pp = pp;
    c.pipeline.microbatches = 2;
    return c;
  };
  const Params one = paratrain::testing::one_process(config("one", 1, 2));
  const double pp2 = relative_diff(paratrain::testing::train_ranks(config("pp2", 2, 1), 2), one);
  std::printf("MoE GPT in 2 pipeline stages (2 micro-batches) vs one process accumulating 2: %.3g\n", pp2);
  EXPECT_LE(pp2, 1e-5);
  // The dp ranks' pipeline micro-batch i is one process's micro-batch i
  // (train/loop/batch_shares.cpp: each rank's batch is its runs of them).
  const double pp2dp2 = relative_diff(paratrain::testing::train_ranks(config("pp2dp2", 2, 1), 4), one);
  std::printf("MoE GPT, pp 2 x dp 2 vs one process accumulating 2: %.3g\n", pp2dp2);
  EXPECT_LE(pp2dp2, 1e-5);
  for (const auto& [name, zero, tp] : std::vector<std::tuple<std::string, int64_t, int64_t>>{{"pp2dp2z1", 1, 1}, {"pp2tp2", 0, 2}}) {
    TrainConfig c = config(name, 2, 1);
    c.zero.stage = zero;
    c.parallel.tp = tp;
    const double d = relative_diff(paratrain::testing::train_ranks(c, 4), one);
    std::printf("MoE GPT, %s (megatron stages) vs one process accumulating 2: %.3g\n", name.c_str(), d);
    EXPECT_LE(d, 1e-5);
  }
  // Activation checkpointing: each recompute sees its micro-batch's loss
  // weight again (models/recompute.cpp) and counts its routing once.
  TrainConfig pp_recompute = config("pp2_recompute", 2, 1);
  pp_recompute.pipeline.checkpoint_activations = true;
  const double recompute_pp = relative_diff(paratrain::testing::train_ranks(pp_recompute, 2), one);
  TrainConfig dp_recompute = config("dp2_recompute", 1, 2);
  dp_recompute.train.activation_checkpointing = "blocks";
  const double recompute_dp = relative_diff(paratrain::testing::train_ranks(dp_recompute, 2), one);
  std::printf("MoE GPT recomputed in backward: pp 2 (pipeline.checkpoint_activations) %.3g, dp 2 "
              "(train.activation_checkpointing = blocks) %.3g vs one process accumulating 2\n",
              recompute_pp, recompute_dp);
  EXPECT_LE(recompute_pp, 1e-5);
  EXPECT_LE(recompute_dp, 1e-5);
  // Control: the first stage's aux gradient is in what was compared.
  TrainConfig no_aux = config("pp2_no_aux", 2, 1);
  no_aux.model.moe_aux_loss = 0;
  EXPECT_GT(relative_diff(paratrain::testing::train_ranks(no_aux, 2), one), 100 * std::max(pp2, 1e-7));
  // The routing record sums both stages' layers, each forward once (also
  // when recomputed).
  for (const char* run : {"pp2", "pp2_recompute", "dp2_recompute"}) {
  int records = 0;
  std::ifstream in(std::filesystem::path(dir) / run / "version_0" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") != "moe") continue;
    ++records;
    ASSERT_EQ(j["layers"].size(), 2u);
    for (const auto& layer : j["layers"]) {
      EXPECT_EQ(layer["tokens"], 6 * 8 * 16) << layer["layer"];
      EXPECT_EQ(layer["forwards"], 6 * 2) << run << " " << layer["layer"];  // 2 micro-batches a step
      EXPECT_GT(layer["aux_loss"].get<double>(), 0) << layer["layer"];
    }
  }
  EXPECT_EQ(records, 1) << run;
  }
}

// Expert parallelism in pipeline stages (Note [Experts in pipeline stages]):
// at pp 2 x dp 2 x ep 2 each stage's MoE layer keeps 2 of its 4 experts on
// each replica and routes over both, as pp 2 x dp 2 does at ep 1 (with tp 2
// inside each stage, ZeRO-1 over the replicas, or both: the megatron
// strategy's stages, the experts whole beside ZeRO's pieces): equal to
// one process accumulating 2, with drops and the aux loss on, and clipped
// (the dense and the expert norms both count). A checkpoint saved in
// either after 3 steps resumes on one process, equal to the uninterrupted
// run.
TEST(MoeGptTrainer, ExpertParallelInPipelineStagesEqualsOneProcess) {
  const std::string dir = paratrain::testing::temp_dir("moe-ep-pp");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 5);
  auto config = [&](const std::string& name, int64_t pp, int64_t ep, int64_t accumulate) {
    TrainConfig c = moe_config(dir, corpus, name);
    c.model.moe_every = 1;  // both blocks: one on each stage
    c.optimizer.clip_grad_norm = 0.5;
    c.train.accumulate = accumulate;
    c.parallel.pp = pp;
    c.parallel.ep = ep;
    c.pipeline.microbatches = 2;
    return c;
  };
  const Params one = paratrain::testing::one_process(config("one", 1, 1, 2));
  TrainConfig unclipped = config("one_unclipped", 1, 1, 2);
  unclipped.optimizer.clip_grad_norm = 0;
  EXPECT_GT(relative_diff(paratrain::testing::one_process(unclipped), one), 1e-3) << "the clipping binds";
  // The pipeline strategy (pp 2 x dp 2), and the megatron strategy's
  // stages: with tensor parallelism inside (pp 2 x tp 2 x dp 2), with
  // ZeRO-1's pieces beside the experts (ZeRO-2 is refused with pp: the tied
  // embedding), and with both.
  const std::vector<std::pair<int64_t, int64_t>> layouts{{1, 0}, {2, 0}, {1, 1}, {2, 1}};  // tp, zero.stage
  for (const auto& [tp, zero] : layouts) {
    TrainConfig c = config(fmt::format("pp2tp{}dp2ep2z{}", tp, zero), 2, 2, 1);
    c.parallel.tp = tp;
    c.zero.stage = zero;
    const auto [params, held, numel] = train_ep(c, static_cast<int>(4 * tp));
    for (int64_t n : held) EXPECT_EQ(n, 2) << "each rank holds 2 of its stage's 4 experts";
    // paratrain plan cuts the stages as the strategy does (all experts
    // counted) and counts a rank's E/ep.
    EXPECT_EQ(*std::max_element(numel.begin(), numel.end()), parameters_per_rank(c)) << "the plan's count, tp " << tp;
    ASSERT_EQ(params.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(params[i].first, one[i].first);
    const double diff = relative_diff(params, one);
    std::printf("MoE GPT, pp 2 x tp %lld x dp 2 x ep 2, zero.stage %lld vs one process accumulating 2 (clipped, "
                "drops, aux loss) after 6 steps: %.3g (tolerance 1e-5)\n",
                static_cast<long long>(tp), static_cast<long long>(zero), diff);
    EXPECT_LE(diff, 1e-5);
  }

  // Saved with the experts' momentum beside ZeRO's pieces too.
  for (const auto& [tp, zero] : layouts) {
    const std::string name = fmt::format("pp2tp{}dp2ep2z{}_saved", tp, zero);
    TrainConfig first = config(name, 2, 2, 1);
    first.parallel.tp = tp;
    first.zero.stage = zero;
    first.train.max_steps = 3;
    train_ep(first, static_cast<int>(4 * tp));
    const auto saved = std::filesystem::path(dir) / name / "version_0" / "checkpoints" / "step_00000003";
    ASSERT_TRUE(std::filesystem::exists(saved)) << saved;
    TrainConfig resumed = config(name + "_resumed_one", 1, 1, 2);
    resumed.train.resume = saved.string();
    Params continued;
    paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& g) {
      Trainer t(resumed, g);
      EXPECT_EQ(t.fit().start_step, 3) << "it resumed (a fresh run would equal one process too)";
      continued = t.full_parameters();
    });
    const double after = relative_diff(continued, one);
    std::printf("MoE GPT saved at pp 2 x tp %lld x dp 2 x ep 2, zero.stage %lld after 3 steps, resumed by one "
                "process to 6: %.3g (tolerance 1e-5)\n",
                static_cast<long long>(tp), static_cast<long long>(zero), after);
    EXPECT_LE(after, 1e-5);
  }
}

// An ep the stages cannot split is refused by every rank at once, also by
// a stage with no MoE layer (block 0 here): judged on the whole model
// before the cut. A stage's own check would fail stage 1 and leave stage 0
// waiting in its first step.
TEST(MoeGptTrainer, AnEpThatDoesNotDivideDpFailsEveryStage) {
  const std::string dir = paratrain::testing::temp_dir("moe-ep-pp-bad");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 5);
  TrainConfig c = moe_config(dir, corpus, "bad");  // block 1's MLP only
  c.parallel.pp = 2;  // dp = 2 of the 4 ranks, not set: only the build sees it
  c.parallel.ep = 4;
  c.pipeline.microbatches = 2;
  std::atomic<int> refused{0};
  paratrain::testing::run_ranks(4, [&](comm::ProcessGroup& g) {
    try {
      Trainer t(c, g);
      t.fit();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("does not divide the data-parallel group's 2 ranks"), std::string::npos)
          << e.what();
      ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 4);
}

}  // namespace
}  // namespace paratrain::train

// A mixture-of-experts GPT (model.moe_experts) through the Trainer: its MoE
// blocks route over the data-parallel group's whole batch (moe/moe.h), so 2
// ranks under DDP and ZeRO-2 equal one process on the same global batch,
// with a capacity that drops tokens; the load-balancing loss is in the
// training loss (a run without it trains elsewhere).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/models/gpt.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/run/tensorboard.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"
#include "tests/text_gpt/moe_gpt_runs.h"

namespace paratrain::train {
namespace {

using namespace moe_gpt;

TEST(MoeGptTrainer, TwoRanksUnderDdpAndZero2EqualOneProcessAndTheAuxLossCounts) {
  const std::string dir = paratrain::testing::temp_dir("moe-gpt");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 5);
  TrainConfig one_config = moe_config(dir, corpus, "one");
  one_config.log.tensorboard = true;
  const Params one = paratrain::testing::one_process(one_config);
  const auto events = list_event_files(std::filesystem::path(dir) / "one" / "version_0" / "tensorboard");
  ASSERT_EQ(events.size(), 1u);
  std::map<std::string, double> scalars;  // the run logs once
  for (const auto& e : read_scalar_events(events[0])) scalars[e.tag] = e.value;
  // The MoE block's names: the router and each expert under its index.
  bool router = false, expert3 = false;
  for (const auto& [name, t] : one) {
    router = router || name == "blocks.1.mlp.router.weight";
    expert3 = expert3 || name == "blocks.1.mlp.experts.3.proj.weight";
  }
  EXPECT_TRUE(router && expert3);
  // metrics.jsonl: the routing since the last log point (here: the run's 6
  // steps of 8 sequences x 16 tokens, each token's 2 choices kept or dropped).
  int records = 0;
  std::ifstream in(std::filesystem::path(dir) / "one" / "version_0" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") != "moe") continue;
    ++records;
    ASSERT_EQ(j["layers"].size(), 1u);
    const auto& layer = j["layers"][0];
    EXPECT_EQ(layer["layer"], "blocks.1.mlp");
    EXPECT_EQ(layer["tokens"], 6 * 8 * 16);
    int64_t kept = 0;
    for (int64_t n : layer["load"].get<std::vector<int64_t>>()) kept += n;
    EXPECT_EQ(kept + layer["dropped"].get<int64_t>(), 2 * 6 * 8 * 16);
    EXPECT_GT(layer["dropped"].get<int64_t>(), 0);
    // The same counts in TensorBoard, one scalar per expert's load.
    EXPECT_EQ(scalars["moe/blocks.1.mlp/dropped"], layer["dropped"].get<double>());
    for (size_t e = 0; e < 4; ++e) {
      EXPECT_EQ(scalars[fmt::format("moe/blocks.1.mlp/load/{}", e)], layer["load"][e].get<double>()) << e;
    }
  }
  EXPECT_EQ(records, 1);
  double worst = 0;
  for (const int64_t stage : {0, 2}) {
    TrainConfig c = moe_config(dir, corpus, "two_z" + std::to_string(stage));
    c.zero.stage = stage;
    const double diff = relative_diff(paratrain::testing::train_ranks(c, 2), one);
    worst = std::max(worst, diff);
    std::printf("MoE GPT (4 experts, top-2, drops), 2 ranks, zero.stage %lld vs one process after 6 steps: %.3g "
                "(tolerance 1e-5)\n",
                static_cast<long long>(stage), diff);
    EXPECT_LE(diff, 1e-5);
  }
  // Controls: without the load-balancing loss, and with a capacity that
  // drops nothing, it trains elsewhere (both the aux loss and the drops
  // are in what was compared).
  TrainConfig no_aux = moe_config(dir, corpus, "no_aux");
  no_aux.model.moe_aux_loss = 0;
  EXPECT_GT(relative_diff(paratrain::testing::train_ranks(no_aux, 2), one), 100 * std::max(worst, 1e-7));
  TrainConfig no_drops = moe_config(dir, corpus, "no_drops");
  no_drops.model.moe_capacity_factor = 8;
  EXPECT_GT(relative_diff(paratrain::testing::train_ranks(no_drops, 2), one), 100 * std::max(worst, 1e-7));
}

// parallel.ep: the experts split over ep groups of the data-parallel ranks
// (moe/expert_parallel.h). Each layout trains the one-process model on the
// same global batch: the dense part under DDP or ZeRO-1/2, the experts
// reduced over their replicas, the clipping norm over both.
TrainConfig ep_config(const std::string& dir, const std::filesystem::path& corpus, const std::string& name) {
  TrainConfig c = moe_config(dir, corpus, name);
  c.model.moe_experts = 8;
  c.model.moe_every = 1;                // both blocks
  c.model.moe_capacity_factor = 8;      // nothing dropped
  c.train.max_steps = 10;
  c.optimizer.clip_grad_norm = 0.5;     // binds: the dense and the expert norms both count
  return c;
}

TEST(MoeGptTrainer, ExpertParallelEqualsOneProcessOverEveryLayout) {
  const std::string dir = paratrain::testing::temp_dir("moe-ep");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 6);
  const Params one = paratrain::testing::one_process(ep_config(dir, corpus, "one"));
  // The clipping binds: without it one process trains elsewhere.
  TrainConfig unclipped = ep_config(dir, corpus, "one_unclipped");
  unclipped.optimizer.clip_grad_norm = 0;
  EXPECT_GT(relative_diff(paratrain::testing::one_process(unclipped), one), 1e-3);
  // Accumulated micro-batches route and balance each micro-batch on its
  // own, so the aux loss (not additive over micro-batches) is off there.
  TrainConfig no_aux = ep_config(dir, corpus, "one_no_aux");
  no_aux.model.moe_aux_loss = 0;
  const Params one_no_aux = paratrain::testing::one_process(no_aux);
  struct Layout {
    int world;
    int64_t ep, zero_stage;
    bool accumulate = false;  // 2 micro-batches per rank and step
    bool scaled = false;      // a dynamic loss scale (fp32: exact powers of two)
  };
  for (const Layout l : {Layout{2, 2, 0}, Layout{4, 4, 0}, Layout{4, 2, 0, true}, Layout{4, 2, 1}, Layout{2, 2, 2, false, true}}) {
    TrainConfig c = ep_config(dir, corpus, fmt::format("w{}_ep{}_z{}_a{}_s{}", l.world, l.ep, l.zero_stage, l.accumulate, l.scaled));
    c.parallel.ep = l.ep;
    c.zero.stage = l.zero_stage;
    if (l.accumulate) {
      c.data.batch_size = 8 / l.world / 2;
      c.model.moe_aux_loss = 0;
    }
    if (l.scaled) c.precision.loss_scale = "dynamic";
    const auto [params, held, numel] = train_ep(c, l.world);
    for (int64_t n : held) EXPECT_EQ(n, 8 / l.ep) << "each rank holds its share of the experts";
    for (int64_t n : numel) EXPECT_EQ(n, parameters_per_rank(c)) << "paratrain plan's count of a rank";
    ASSERT_EQ(params.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(params[i].first, one[i].first);
    const double diff = relative_diff(params, l.accumulate ? one_no_aux : one);
    std::printf("MoE GPT (8 experts, top-2, clipped), dp %d x ep %lld, zero.stage %lld%s%s vs one process after 10 "
                "steps: %.3g (tolerance 1e-5)\n",
                l.world, static_cast<long long>(l.ep), static_cast<long long>(l.zero_stage),
                l.accumulate ? ", 2 micro-batches" : "", l.scaled ? ", dynamic loss scale" : "", diff);
    EXPECT_LE(diff, 1e-5);
  }
}

TEST(MoeGptTrainer, ExpertParallelDropsTheTokensOneProcessDrops) {
  const std::string dir = paratrain::testing::temp_dir("moe-ep-drops");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 7);
  TrainConfig c = ep_config(dir, corpus, "one");
  c.model.moe_capacity_factor = 0.75;
  c.train.max_steps = 6;
  const Params one = paratrain::testing::one_process(c);
  c.run.name = "dp4_ep2";
  c.parallel.ep = 2;
  const double diff = relative_diff(train_ep(c, 4).params, one);
  std::printf("MoE GPT with drops, dp 4 x ep 2 vs one process after 6 steps: %.3g (tolerance 1e-5)\n", diff);
  EXPECT_LE(diff, 1e-5);
  // Control: a capacity that drops nothing trains elsewhere.
  c.run.name = "no_drops";
  c.model.moe_capacity_factor = 8;
  EXPECT_GT(relative_diff(train_ep(c, 4).params, one), 100 * std::max(diff, 1e-7));
}

// Under tensor parallelism the plan splits attention, the dense MLPs and
// the vocabulary; the MoE layers are replicated over tp (every tp rank
// routes the same tokens), so tp = 2 and tp = 2 x dp = 2 equal one process,
// drops and aux loss included, with a dense block beside the MoE block and
// with every block MoE (no mlp rules in the plan).
TEST(MoeGptTrainer, TensorParallelismReplicatesTheMoeLayers) {
  const std::string dir = paratrain::testing::temp_dir("moe-tp");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 11);
  for (const int64_t every : {2, 1}) {
    TrainConfig c = moe_config(dir, corpus, fmt::format("one_every{}", every));
    c.model.moe_every = every;
    const Params one = paratrain::testing::one_process(c);
    for (const int world : {2, 4}) {
      c.run.name = fmt::format("tp2_world{}_every{}", world, every);
      c.parallel.tp = 2;
      const EpRun run = train_ep(c, world);
      for (int64_t n : run.experts) EXPECT_EQ(n, 4) << "replicated: every expert on every rank";
      for (int64_t n : run.parameters) EXPECT_EQ(n, parameters_per_rank(c)) << "paratrain plan's count of a rank";
      ASSERT_EQ(run.params.size(), one.size());
      for (size_t i = 0; i < one.size(); ++i) {
        ASSERT_EQ(run.params[i].first, one[i].first);
        const double d = relative_diff({run.params[i]}, {one[i]});
        if (d > 1e-5) std::printf("  %s differs by %.3g\n", one[i].first.c_str(), d);
      }
      const double diff = relative_diff(run.params, one);
      std::printf("MoE GPT (moe_every %lld), tp 2 x dp %d vs one process after 6 steps: %.3g (tolerance 1e-5)\n",
                  static_cast<long long>(every), world / 2, diff);
      EXPECT_LE(diff, 1e-5);
    }
    // tp 2 x dp 2 with the experts over ep 2 (inside dp, whole on each tp
    // rank), clipped: the norm counts each expert once.
    c.run.name = fmt::format("tp2_dp2_ep2_every{}", every);
    c.parallel.ep = 2;
    c.optimizer.clip_grad_norm = 0.05;
    TrainConfig clipped = moe_config(dir, corpus, fmt::format("one_clipped_every{}", every));
    clipped.model.moe_every = every;
    clipped.optimizer.clip_grad_norm = 0.05;
    const Params one_clipped = paratrain::testing::one_process(clipped);
    EXPECT_GT(relative_diff(one_clipped, one), 1e-3) << "the clipping binds";
    const EpRun run = train_ep(c, 4);
    for (int64_t n : run.experts) EXPECT_EQ(n, 2) << "ep 2: half the experts on each rank";
    for (int64_t n : run.parameters) EXPECT_EQ(n, parameters_per_rank(c)) << "paratrain plan's count of a rank";
    const double diff = relative_diff(run.params, one_clipped);
    std::printf("MoE GPT (moe_every %lld), tp 2 x dp 2 x ep 2, clipped, vs one process after 6 steps: %.3g "
                "(tolerance 1e-5)\n",
                static_cast<long long>(every), diff);
    EXPECT_LE(diff, 1e-5);
    // Stopped after 3 steps (tp shards, experts and their momentum written
    // from ep group 0's tp rank 0), resumed by one process to 6: the
    // uninterrupted one process.
    TrainConfig half = c;
    half.run.name = fmt::format("tp2_dp2_ep2_half_every{}", every);
    half.train.max_steps = 3;
    train_ep(half, 4);
    TrainConfig resumed = clipped;
    resumed.run.name = fmt::format("resumed_every{}", every);
    resumed.train.resume =
        (std::filesystem::path(dir) / half.run.name / "version_0" / "checkpoints" / "step_00000003").string();
    const double again = relative_diff(paratrain::testing::one_process(resumed), one_clipped);
    std::printf("  saved at tp 2 x dp 2 x ep 2 after 3 steps, resumed by one process to 6: %.3g\n", again);
    EXPECT_LE(again, 1e-5);
    // The same with ZeRO-2 over the replicas: the dense part in pieces, the
    // experts whole beside them (stepped, clipped and cleared there).
    TrainConfig z2 = c;
    z2.run.name = fmt::format("tp2_dp2_ep2_zero2_every{}", every);
    z2.zero.stage = 2;
    const double zero2 = relative_diff(train_ep(z2, 4).params, one_clipped);
    std::printf("  the same under ZeRO-2: %.3g\n", zero2);
    EXPECT_LE(zero2, 1e-5);
  }
}

// A frozen expert stays out of the reduction and the optimizer on its
// holders and is written once into checkpoints, as every other expert.
TEST(MoeGptTrainer, AFrozenExpertUnderExpertParallelism) {
  const std::string dir = paratrain::testing::temp_dir("moe-ep-frozen");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 10);
  TrainConfig c = ep_config(dir, corpus, "one");
  c.train.max_steps = 4;
  c.freeze.modules = {"blocks.0.mlp.experts.5"};
  const Params one = paratrain::testing::one_process(c);
  c.run.name = "dp4_ep2";
  c.parallel.ep = 2;
  const Params four = train_ep(c, 4).params;
  const double diff = relative_diff(four, one);
  std::printf("MoE GPT with expert 5 frozen, dp 4 x ep 2 vs one process after 4 steps: %.3g (tolerance 1e-5)\n", diff);
  EXPECT_LE(diff, 1e-5);
  // The consolidated checkpoint holds the frozen expert once, as trained.
  const auto saved = std::filesystem::path(dir) / "dp4_ep2" / "version_0" / "checkpoints" / "step_00000004";
  ASSERT_TRUE(std::filesystem::exists(saved)) << saved;
  c.run.name = "resumed";
  c.parallel.ep = 1;
  c.train.resume = saved.string();
  const double again = relative_diff(paratrain::testing::one_process(c), one);  // nothing left to train
  EXPECT_LE(again, 1e-6);
}

// A checkpoint saved at ep = 4 names each expert by its global index: a run
// at ep = 2 and one process resume from it, each equal to one uninterrupted
// process.
TEST(MoeGptTrainer, ACheckpointAtEp4ResumesAtEp2AndOneProcess) {
  const std::string dir = paratrain::testing::temp_dir("moe-ep-resume");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 8);
  const Params one = paratrain::testing::one_process(ep_config(dir, corpus, "one"));
  // Saved after 5 of the 10 steps at dp 4 x ep 4 (DDP), and at dp 4 x ep 2
  // under ZeRO-2 (each expert's second replica does not write; the experts'
  // momentum beside ZeRO's shards).
  struct Save {
    std::string name;
    int64_t ep, zero_stage;
  };
  for (const Save& save : {Save{"ep4", 4, 0}, Save{"ep2_z2", 2, 2}}) {
    TrainConfig first = ep_config(dir, corpus, save.name);
    first.parallel.ep = save.ep;
    first.zero.stage = save.zero_stage;
    first.train.max_steps = 5;
    train_ep(first, 4);
    const auto saved = std::filesystem::path(dir) / save.name / "version_0" / "checkpoints" / "step_00000005";
    ASSERT_TRUE(std::filesystem::exists(saved)) << saved;
    for (const int64_t ep : {save.ep == 4 ? int64_t{2} : int64_t{4}, int64_t{1}}) {
      TrainConfig c = ep_config(dir, corpus, fmt::format("{}_resumed_ep{}", save.name, ep));
      c.parallel.ep = ep;
      c.zero.stage = save.zero_stage;
      c.train.resume = saved.string();
      const int world = ep == 1 ? 1 : static_cast<int>(ep);
      const Params resumed = world == 1 ? paratrain::testing::one_process(c) : train_ep(c, world).params;
      const double diff = relative_diff(resumed, one);
      std::printf("MoE GPT saved at dp 4 x ep %lld (zero.stage %lld) after 5 steps, resumed at %s to 10: %.3g vs "
                  "one process (tolerance 1e-5)\n",
                  static_cast<long long>(save.ep), static_cast<long long>(save.zero_stage),
                  world == 1 ? "one process" : fmt::format("dp {} x ep {}", world, ep).c_str(), diff);
      EXPECT_LE(diff, 1e-5);
    }
  }
}

TEST(MoeGptTrainer, ExpertParallelKeysAreChecked) {
  const std::string gpt = "[model]\nkind = \"gpt\"\nmoe_experts = 8\n[data]\ndataset = \"text\"\npath = \"x\"\n";
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.ep=4"}));
  for (const char* key : {"model.moe_experts=0", "model.moe_experts=6", "parallel.dp=2", "zero.stage=3",
                          "parallel.cp=2", "elastic.in_job=true"}) {
    EXPECT_THROW(config_from_toml_string(gpt, {"parallel.ep=4", key}), ConfigError) << key;
  }
  // In pipeline stages: beside DDP, with tensor parallelism too, not yet
  // beside ZeRO.
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.ep=4", "parallel.pp=2"}));
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.ep=4", "parallel.pp=2", "parallel.tp=2"}));
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.ep=4", "parallel.pp=2", "zero.stage=1"}));
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.ep=4", "parallel.tp=2"}));
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.ep=4", "parallel.tp=2", "zero.stage=2"}));
  // ep must divide the data-parallel ranks, known when the world is.
  const std::string dir = paratrain::testing::temp_dir("moe-ep-keys");
  TrainConfig c = ep_config(dir, paratrain::testing::write_word_corpus(dir, 9), "ep4_on_2");
  c.parallel.ep = 4;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) { EXPECT_THROW(Trainer(c, g), ConfigError); });
}

// paratrain plan's Ψ of a MoE GPT: exactly the built model's parameters.
TEST(MoeGptTrainer, ThePlannerCountsEveryExpert) {
  TrainConfig c = paratrain::testing::tiny_gpt_config("/tmp", "/tmp/x");
  for (const int64_t every : {1, 2, 3}) {
    c.model.layers = 3;
    c.model.moe_experts = 4;
    c.model.moe_every = every;
    int64_t built = 0;
    for (const auto& p : make_model(c)->parameters()) built += p.numel();
    EXPECT_EQ(parameter_count(c), built) << "moe_every " << every;
  }
}

TEST(MoeGptTrainer, MoeKeysAreCheckedAgainstTheModelAndLayout) {
  EXPECT_THROW(config_from_toml_string("[model]\nkind = \"mlp\"\nmoe_experts = 4\n"), ConfigError);
  EXPECT_THROW(config_from_toml_string("[model]\nkind = \"gpt\"\nmoe_experts = 1\nmoe_top_k = 2\n[data]\n"
                                       "dataset = \"text\"\npath = \"x\"\n"),
               ConfigError);
  const std::string gpt = "[model]\nkind = \"gpt\"\nmoe_experts = 4\n[data]\ndataset = \"text\"\npath = \"x\"\n";
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.pp=2"}));
  EXPECT_NO_THROW(config_from_toml_string(gpt, {"parallel.pp=2", "zero.stage=1"}));
  EXPECT_THROW(config_from_toml_string(gpt, {"parallel.cp=2"}), ConfigError);
  // What the routing and the aux loss do not survive yet (docs/moe.md, Limits).
  for (const char* key : {"freeze.adaptive=true", "elastic.in_job=true",
                          "data.batch_shares=[3,1]", "ddp.mode=none", "quant.qat=true"}) {
    EXPECT_THROW(config_from_toml_string("[model]\nkind = \"gpt\"\nmoe_experts = 4\n[data]\ndataset = \"text\"\n"
                                         "path = \"x\"\n",
                                         {key}),
                 ConfigError)
        << key;
  }
}

}  // namespace
}  // namespace paratrain::train

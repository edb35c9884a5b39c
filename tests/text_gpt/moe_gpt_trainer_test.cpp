// A mixture-of-experts GPT (model.moe_experts) through the Trainer: its MoE
// blocks route over the data-parallel group's whole batch (moe/moe.h), so 2
// ranks under DDP and ZeRO-2 equal one process on the same global batch,
// with a capacity that drops tokens; the load-balancing loss is in the
// training loss (a run without it trains elsewhere).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/models/gpt.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::Params;
using paratrain::testing::relative_diff;

TrainConfig moe_config(const std::string& dir, const std::filesystem::path& corpus, const std::string& name) {
  TrainConfig c = paratrain::testing::tiny_gpt_config(dir, corpus);
  c.run.name = name;
  c.model.layers = 2;
  c.data.global_batch_size = 8;  // one process's batch, split over the ranks
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_capacity_factor = 0.75;  // drops: each expert takes 3/8 of a step's token pairs at most
  c.model.moe_every = 2;               // block 1's MLP
  c.model.moe_aux_loss = 0.05;
  c.train.max_steps = 6;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  return c;
}

TEST(MoeGptTrainer, TwoRanksUnderDdpAndZero2EqualOneProcessAndTheAuxLossCounts) {
  const std::string dir = paratrain::testing::temp_dir("moe-gpt");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 5);
  const Params one = paratrain::testing::one_process(moe_config(dir, corpus, "one"));
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
  EXPECT_THROW(config_from_toml_string("[model]\nkind = \"gpt\"\nmoe_experts = 4\n[data]\ndataset = \"text\"\n"
                                       "path = \"x\"\n[parallel]\ntp = 2\n"),
               ConfigError);
  // What the routing and the aux loss do not survive yet (docs/moe.md, Limits).
  for (const char* key : {"train.activation_checkpointing=blocks", "freeze.adaptive=true", "elastic.in_job=true",
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

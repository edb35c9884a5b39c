// Tensor-parallel plans applied directly (parallelize/plan.h) to the
// transformer of tiny_lm.h over 2 ranks: gradients equal one process's,
// and a plan whose colwise layers skip the input gradient's sum misses them
// by far; plans that cannot work are refused naming the rule or module; a
// tied tensor is split once; Megatron-SP without entering the sequence split
// is named; the planner counts what a rank holds; a TOML table is a plan.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "paratrain/core/error.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/parallelize/sites.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/task.h"
#include "paratrain/train/trainer.h"
#include "paratrain/train/user_module.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_lm.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::Params;
using paratrain::testing::relative_diff;
using namespace paratrain::testing::tiny_lm;
namespace pz = paratrain::parallelize;
namespace F = torch::nn::functional;

// One forward and backward of the model at tp=2 under `plan` against one
// process: the worst relative difference of the gathered gradients.
double gradient_diff(const pz::TpPlan& plan) {
  static std::mutex build;
  auto make = [] {
    std::lock_guard<std::mutex> lock(build);
    torch::manual_seed(21);
    return std::make_shared<TinyLmImpl>();
  };
  const auto rows = token_rows(4, 9);
  auto reference = make();
  F::cross_entropy(reference->forward(rows.inputs).reshape({-1, kVocab}), rows.targets.reshape({-1})).backward();
  double worst = 0;
  std::mutex mu;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    auto model = make();
    const tensor_parallel::TpContext ctx{&g, std::chrono::seconds(60)};
    pz::parallelize_module(*model, plan, {.tp = ctx});
    F::cross_entropy(model->forward(rows.inputs).reshape({-1, kVocab}), rows.targets.reshape({-1})).backward();
    const auto grads = tensor_parallel::gather_full_parameters(*model, ctx, tensor_parallel::Gather::kGradients);
    // Per tensor, relative to its largest gradient, floored at 1% of the
    // model's largest: a key bias's true gradient is zero (a constant added
    // to every score of a query), so its values are rounding noise.
    double scale = 0, d = 0;
    for (const auto& p : reference->parameters()) scale = std::max(scale, p.grad().abs().max().item<double>());
    for (const auto& p : reference->named_parameters()) {
      const at::Tensor want = p.value().grad(), got = grads[p.key()];
      d = std::max(d, (got - want).abs().max().item<double>() /
                          std::max(want.abs().max().item<double>(), 1e-2 * scale));
    }
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
  });
  return worst;
}

TEST(TpPlan, GradientsEqualOneProcessAndWithoutTheInputGradientSumTheyDoNot) {
  pz::TpPlan plan = plan_of(plan_entries());
  const double right = gradient_diff(plan);
  plan.defect_skip_input_gradient_sum = true;
  const double defect = gradient_diff(plan);
  std::printf("gradients at tp=2: %.3g with the plan, %.3g without the input gradient sum\n", right, defect);
  EXPECT_LE(right, 1e-5);
  EXPECT_GT(defect, 1e-2);
}

// The message of what parallelize_module throws for `plan` at tp=2 (rank 0's).
std::string refusal(const pz::TpPlan& plan) {
  std::string message;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    auto model = std::make_shared<TinyLmImpl>();
    try {
      pz::parallelize_module(*model, plan, {.tp = {&g, std::chrono::seconds(60)}});
    } catch (const std::exception& e) {
      if (g.rank() == 0) message = e.what();
    }
  });
  return message;
}

TEST(TpPlan, PlansThatCannotWorkAreRefusedNamingTheRuleOrModule) {
  auto with = [](std::vector<std::pair<std::string, std::string>> rules) {
    pz::TpPlan plan;
    for (const auto& [pattern, style] : rules) plan.add(pattern, style);
    return plan;
  };
  EXPECT_NE(refusal(with({{"blocks.*.attn.qkv", "colwise"}}))
                .find("rule \"blocks.*.attn.qkv\" (colwise) matches no module"),
            std::string::npos);
  EXPECT_NE(refusal(with({{"blocks.0.ln1", "colwise"}})).find("applies to torch::nn::Linear only"),
            std::string::npos)
      << refusal(with({{"blocks.0.ln1", "colwise"}}));
  EXPECT_NE(refusal(with({{"head", "colwise"}, {"h*", "rowwise"}})).find("'head' is matched as colwise and as rowwise"),
            std::string::npos);
  EXPECT_NE(refusal(with({{"tok", "rowwise"}})).find("applies to torch::nn::Linear only"), std::string::npos);
  // A pattern's * stays inside one name: "blocks.*" names the blocks, not their layers.
  EXPECT_NE(refusal(with({{"blocks.*", "colwise"}})).find("'blocks.0' is a"), std::string::npos);
  EXPECT_NE(refusal(with({{"blocks.0.attn.q", "colwise[parts=3]"}})).find("not divisible by parts (3) x tp = 2"),
            std::string::npos)
      << refusal(with({{"blocks.0.attn.q", "colwise[parts=3]"}}));
  // A sequence_parallel parent of split layers would sum their shards.
  EXPECT_NE(refusal(with({{"blocks.*", "sequence_parallel"}, {"blocks.*.attn.q", "colwise"}}))
                .find("is sequence_parallel but holds 'blocks.0.attn.q' (colwise)"),
            std::string::npos)
      << refusal(with({{"blocks.*", "sequence_parallel"}, {"blocks.*.attn.q", "colwise"}}));
  EXPECT_THROW(pz::StyleSpec::parse("colwise[parts=0]"), ConfigError);
  EXPECT_THROW(pz::StyleSpec::parse("colwise[parts=99999999999]"), ConfigError);
  EXPECT_THROW(pz::StyleSpec::parse("rowwise[gather]"), ConfigError);
  EXPECT_EQ(pz::StyleSpec::parse("colwise[parts=3]").str(), "colwise[parts=3]");
  EXPECT_EQ(pz::StyleSpec::parse("colwise[gather]").str(), "colwise[gather]");
}

// Tied weights two ways: the token table registered again as "head" (one
// module, two names), or a head module holding the table's tensor as its own.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& weight) { register_parameter("weight", weight); }
};

struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(bool same_module) : tok(register_module("tok", torch::nn::Embedding(kVocab, kDim))) {
    if (same_module) register_module("head", tok);
    else register_module("head", std::make_shared<TiedHeadImpl>(tok->weight));
  }
  torch::nn::Embedding tok;
};

TEST(TpPlan, ATiedWeightIsSplitOnceAndAModuleRunningItWholeIsRefused) {
  for (const bool same_module : {true, false}) {
    std::string message;
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
      auto model = std::make_shared<TiedImpl>(same_module);
      pz::TpPlan plan;
      plan.add("tok", "vocab_embedding");
      if (same_module) plan.add("head", "vocab_embedding");
      try {
        pz::parallelize_module(*model, plan, {.tp = {&g, std::chrono::seconds(60)}});
      } catch (const Error& e) {
        if (g.rank() == 0) message = e.what();
      }
    });
    EXPECT_NE(message.find("tok.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("tied_logits"), std::string::npos) << message;
  }
}

TEST(TpPlan, MegatronSpWithoutEnteringTheSequenceSplitIsNamed) {
  // A model whose forward never calls enter_sequence_parallel.
  struct NoEnterImpl : torch::nn::Module {
    NoEnterImpl()
        : up(register_module("up", torch::nn::Linear(kDim, 2 * kDim))),
          down(register_module("down", torch::nn::Linear(2 * kDim, kDim))) {}
    at::Tensor forward(const at::Tensor& x) { return pz::linear(*down, pz::linear(*up, x)); }
    torch::nn::Linear up, down;
  };
  std::string message;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    auto model = std::make_shared<NoEnterImpl>();
    pz::TpPlan plan;
    plan.add("up", "colwise").add("down", "rowwise");
    plan.sequence_parallel = true;
    pz::parallelize_module(*model, plan, {.tp = {&g, std::chrono::seconds(60)}});
    try {
      pz::check_sites_ran(*model);  // as the Trainer does after the first forward
    } catch (const Error& e) {
      if (g.rank() == 0) message = e.what();
    }
  });
  EXPECT_NE(message.find("never called paratrain::parallelize::enter_sequence_parallel"), std::string::npos)
      << message;
}


// paratrain plan's Ψ for a planned model: exactly what a rank holds.
TEST(TpPlan, ThePlannerCountsWhatATpRankHolds) {
  TrainConfig c = paratrain::testing::mlp_oracle_config("/tmp", "planner", 0);
  c.model.hidden = {64, 32};
  c.parallel.tp_plan = {"fc0=colwise", "fc1=rowwise"};
  for (const int64_t tp : {2, 4}) {
    c.parallel.tp = tp;
    int64_t held = 0;
    paratrain::testing::run_ranks(static_cast<int>(tp), [&](comm::ProcessGroup& g) {
      auto model = make_model(c);
      pz::parallelize_module(*model, tp_plan_of(c), {.tp = {&g, std::chrono::seconds(60)}});
      int64_t n = 0;
      for (const auto& p : model->parameters()) n += p.numel();
      if (g.rank() == 0) held = n;
    });
    EXPECT_EQ(parameters_per_rank(c), held) << "tp " << tp;
    EXPECT_LT(held, parameter_count(c));
  }
}

TEST(TpPlan, ATomlTableIsThePlansEntries) {
  const TrainConfig c = config_from_toml_string(
      "[model]\nkind = \"mlp\"\n[parallel]\ntp = 2\n[parallel.tp_plan]\n\"fc0\" = \"colwise\"\nfc1 = \"rowwise\"\n");
  EXPECT_EQ(c.parallel.tp_plan, (std::vector<std::string>{"fc0=colwise", "fc1=rowwise"}));
  EXPECT_THROW(config_from_toml_string("[parallel.tp_plan]\nfc0 = \"colwize\"\n"), ConfigError);
  EXPECT_THROW(config_from_toml_string("[parallel]\ntp = 2\n[model]\nkind = \"mlp\"\n"), ConfigError);
  // The GPT's plan is built in, at any tp.
  EXPECT_THROW(config_from_toml_string("[model]\nkind = \"gpt\"\n[data]\ndataset = \"text\"\npath = \"x\"\n"
                                       "[parallel]\ntp_plan = [\"wte=replicate\"]\n"),
               ConfigError);
}


}  // namespace
}  // namespace paratrain::train

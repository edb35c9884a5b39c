// Tensor-parallel plans for a program's own model (parallelize/plan.h):
// a transformer written here, not paratrain's GPT (post-norm blocks,
// separate q/k/v projections, a gated MLP, an untied head), split by a
// plan over 2 ranks. Through the Trainer at tp=2, tp=2 x dp=2 (with ZeRO-1)
// and with Megatron-SP it equals one process on the same global batch
// (rtol 1e-5 after 10 SGD steps); a tp=2 checkpoint resumes on one process.
// Controls: a plan whose colwise layers skip the input gradient's sum, and
// one step less, are told apart by far. Plans that cannot work are refused
// naming the rule or module; a planned layer called directly (not at its
// site) stops the first step naming it.
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
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::Params;
using paratrain::testing::relative_diff;
namespace pz = paratrain::parallelize;
namespace F = torch::nn::functional;

constexpr int64_t kVocab = 64, kSeq = 16, kDim = 32, kHeads = 4;

// Attention with separate q, k, v and an output projection; this rank's
// heads under a plan.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl()
      : q(register_module("q", torch::nn::Linear(kDim, kDim))),
        k(register_module("k", torch::nn::Linear(kDim, kDim))),
        v(register_module("v", torch::nn::Linear(kDim, kDim))),
        out(register_module("out", torch::nn::Linear(kDim, kDim))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t heads = pz::local_share(*this, kHeads, "heads"), hd = kDim / kHeads;
    auto split = [&](const at::Tensor& t) { return t.view({t.size(0), t.size(1), heads, hd}).transpose(1, 2); };
    const at::Tensor qh = split(pz::linear(*q, x)), kh = split(pz::linear(*k, x)), vh = split(pz::linear(*v, x));
    const int64_t s = qh.size(2);
    at::Tensor att = torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    const auto future = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = att.masked_fill(future, -INFINITY).softmax(-1);
    const at::Tensor y = torch::matmul(att, vh).transpose(1, 2).reshape({qh.size(0), s, heads * hd});
    return pz::linear(*out, y);
  }
  torch::nn::Linear q, k, v, out;
};
TORCH_MODULE(Attention);

// A gated MLP: down(silu(gate(x)) * up(x)).
struct GatedMlpImpl : torch::nn::Module {
  GatedMlpImpl()
      : gate(register_module("gate", torch::nn::Linear(kDim, 2 * kDim))),
        up(register_module("up", torch::nn::Linear(kDim, 2 * kDim))),
        down(register_module("down", torch::nn::Linear(2 * kDim, kDim))) {}
  at::Tensor forward(const at::Tensor& x) {
    return pz::linear(*down, torch::silu(pz::linear(*gate, x)) * pz::linear(*up, x));
  }
  torch::nn::Linear gate, up, down;
};
TORCH_MODULE(GatedMlp);

// Post-norm: x = norm(x + f(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : attn(register_module("attn", Attention())),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        mlp(register_module("mlp", GatedMlp())),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = ln1(x + attn(x));
    return ln2(h + mlp(h));
  }
  Attention attn;
  torch::nn::LayerNorm ln1;
  GatedMlp mlp;
  torch::nn::LayerNorm ln2;
};
TORCH_MODULE(Block);

// call_sites = false: the planned head called as head(h), a defect the
// Trainer must catch.
struct TinyLmImpl : torch::nn::Module {
  explicit TinyLmImpl(bool call_sites = true)
      : tok(register_module("tok", torch::nn::Embedding(kVocab, kDim))),
        pos(register_module("pos", torch::nn::Embedding(kSeq, kDim))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(), Block()))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        head(register_module("head", torch::nn::Linear(kDim, kVocab))),
        call_sites_(call_sites) {}
  at::Tensor forward(const at::Tensor& ids) {
    const at::Tensor positions =
        torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    at::Tensor h = pz::embedding(*tok, ids.to(torch::kLong)) + pos(positions);
    h = pz::enter_sequence_parallel(*this, h);
    for (const auto& b : *blocks) h = b->as<BlockImpl>()->forward(h);
    h = ln_f(h);
    // The defect a plan must catch: the planned head called as head(h).
    return call_sites_ ? pz::linear(*head, h) : head(h);
  }
  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
  bool call_sites_;
};

std::vector<std::string> plan_entries() {
  return {"tok=vocab_embedding",       "blocks.*.attn.[qkv]=colwise", "blocks.*.attn.out=rowwise",
          "blocks.*.mlp.gate=colwise", "blocks.*.mlp.up=colwise",     "blocks.*.mlp.down=rowwise",
          "blocks.*.ln?=sequence_parallel", "ln_f=sequence_parallel", "head=colwise[gather]"};
}

pz::TpPlan plan_of(const std::vector<std::string>& entries) {
  pz::TpPlan plan;
  for (const auto& e : entries) plan.add(e.substr(0, e.find('=')), e.substr(e.find('=') + 1));
  return plan;
}

// Sequences whose next token depends on the last two: something to learn.
data::TensorDataset token_rows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = torch::randint(0, kVocab, {n, kSeq + 1}, gen, torch::kLong);
  for (int64_t t = 2; t <= kSeq; ++t) {
    x.select(1, t).copy_((x.select(1, t - 1) * 3 + x.select(1, t - 2)) % kVocab);
  }
  return {x.slice(1, 0, kSeq).contiguous(), x.slice(1, 1, kSeq + 1).contiguous()};
}

TrainerParts lm_parts(bool call_sites = true, int64_t test_rows = 32) {
  TrainerParts p;
  p.model = any_module([call_sites](const TrainConfig&) { return std::make_shared<TinyLmImpl>(call_sites); });
  p.task = language_model_task(kSeq);
  p.data = [test_rows](const TrainConfig& c) {
    return Datasets{token_rows(256, c.run.seed + 1), token_rows(test_rows, c.run.seed + 2)};
  };
  return p;
}

// 10 SGD steps (momentum 0.9), global batch 16.
TrainConfig lm_config(const std::string& dir, const std::string& name) {
  TrainConfig c;
  c.run.name = name;
  c.run.output_dir = dir;
  c.run.seed = 3;
  c.run.log_every = 5;
  c.data.global_batch_size = 16;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.train.epochs = 1;
  c.train.max_steps = 10;
  c.train.eval_every_epochs = 0;
  return c;
}

TrainConfig planned(TrainConfig c, int64_t tp) {
  c.parallel.tp = tp;
  c.parallel.tp_plan = plan_entries();
  return c;
}

std::string last_strategy;

Params train_world(const TrainConfig& c, int world, const TrainerParts& parts) {
  Params out;
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    Trainer t(c, g, parts);
    t.fit();
    auto p = t.full_parameters();
    if (g.rank() == 0) {
      out = std::move(p);
      last_strategy = t.strategy_name();
    }
  });
  return out;
}

TEST(TpPlanTrainer, AUserTransformerEqualsOneProcessAtTp2Tp2xDp2AndWithMegatronSp) {
  const std::string dir = paratrain::testing::temp_dir("tp-plan");
  const Params reference = train_world(lm_config(dir, "one"), 1, lm_parts());
  struct Case {
    const char* name;
    int world;
    TrainConfig config;
  };
  TrainConfig sp = planned(lm_config(dir, "tp2_sp"), 2);
  sp.parallel.megatron_sp = true;
  TrainConfig zero = planned(lm_config(dir, "tp2_dp2_zero1"), 2);
  zero.zero.stage = 1;
  const std::vector<Case> cases = {{"tp=2", 2, planned(lm_config(dir, "tp2"), 2)},
                                   {"tp=2 x dp=2", 4, planned(lm_config(dir, "tp2_dp2"), 2)},
                                   {"tp=2 x dp=2, ZeRO-1", 4, zero},
                                   {"tp=2, Megatron-SP", 2, sp}};
  double worst = 0;
  for (const Case& c : cases) {
    const Params got = train_world(c.config, c.world, lm_parts());
    EXPECT_NE(last_strategy.find("parallel.tp_plan, tp 2"), std::string::npos) << last_strategy;
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, reference[i].first);
      EXPECT_EQ(got[i].second.sizes(), reference[i].second.sizes()) << got[i].first;
    }
    const double diff = relative_diff(got, reference);
    worst = std::max(worst, diff);
    std::printf("user transformer, %s: vs one process after 10 steps: %.3g (tolerance 1e-5)\n", c.name, diff);
    EXPECT_LE(diff, 1e-5) << c.name;
  }
  // One step less is far from both: the comparison sees a step.
  TrainConfig fewer = planned(lm_config(dir, "tp2_nine"), 2);
  fewer.train.max_steps = 9;
  EXPECT_GT(relative_diff(train_world(fewer, 2, lm_parts()), reference), 100 * std::max(worst, 1e-7));
}

TEST(TpPlanTrainer, ATp2CheckpointResumesOnOneProcessAsTheUninterruptedRun) {
  const std::string dir = paratrain::testing::temp_dir("tp-plan");
  const Params reference = train_world(lm_config(dir, "one"), 1, lm_parts());
  TrainConfig first = planned(lm_config(dir, "first"), 2);
  first.train.max_steps = 5;
  first.train.checkpoint_every_steps = 5;
  train_world(first, 2, lm_parts());
  TrainConfig rest = lm_config(dir, "rest");
  rest.train.resume = (std::filesystem::path(dir) / "first" / "version_0" / "checkpoints" / "step_00000005").string();
  const double diff = relative_diff(train_world(rest, 1, lm_parts()), reference);
  std::printf("tp=2 to step 5, resumed on one process to 10, vs uninterrupted: %.3g (tolerance 1e-5)\n", diff);
  EXPECT_LE(diff, 1e-5);
}

// Rank 0's TrainResult of `c` on `world` ranks.
TrainResult fit_world(const TrainConfig& c, int world, const TrainerParts& parts) {
  TrainResult out;
  paratrain::testing::run_ranks(world, [&](comm::ProcessGroup& g) {
    Trainer t(c, g, parts);
    TrainResult r = t.fit();
    if (g.rank() == 0) out = r;
  });
  return out;
}

TEST(TpPlanTrainer, EvaluationAtTp2xDp2EqualsOneProcessWithAnUnevenTestSet) {
  const std::string dir = paratrain::testing::temp_dir("tp-plan");
  auto with_eval = [](TrainConfig c) {
    c.train.max_steps = 0;  // the whole epoch (16 steps), then its evaluation
    c.train.eval_every_epochs = 1;
    return c;
  };
  // 33 rows over 2 replicas: one replica's last round is empty on its tp pair.
  const TrainResult one = fit_world(with_eval(lm_config(dir, "eval_one")), 1, lm_parts(true, 33));
  TrainConfig c = with_eval(planned(lm_config(dir, "eval_tp2_dp2"), 2));
  const TrainResult four = fit_world(c, 4, lm_parts(true, 33));
  std::printf("test loss after one epoch: one process %.8f, tp=2 x dp=2 %.8f (%lld and %lld rows)\n", one.test.loss,
              four.test.loss, static_cast<long long>(one.test.count), static_cast<long long>(four.test.count));
  EXPECT_EQ(four.test.count, one.test.count);
  EXPECT_NEAR(four.test.loss, one.test.loss, 1e-5 * one.test.loss);
}

TEST(TpPlanTrainer, APlanThatLeavesTheOutputSplitIsNamedAtTheFirstStep) {
  const std::string dir = paratrain::testing::temp_dir("tp-plan");
  TrainConfig c = planned(lm_config(dir, "split_output"), 2);
  for (auto& entry : c.parallel.tp_plan) {
    if (entry == "head=colwise[gather]") entry = "head=colwise";  // each rank keeps half the vocabulary
  }
  std::mutex mu;
  std::string message;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    try {
      Trainer t(c, g, lm_parts());
      t.fit();
    } catch (const ConfigError& e) {
      std::lock_guard<std::mutex> lock(mu);
      message = e.what();
    }
  });
  EXPECT_NE(message.find("output differs between the tensor-parallel ranks"), std::string::npos) << message;
}

TEST(TpPlanTrainer, ThePlannedMlpWithActivationCheckpointingEqualsItWithout) {
  const std::string dir = paratrain::testing::temp_dir("tp-plan");
  TrainConfig c = paratrain::testing::mlp_oracle_config(dir, "mlp_tp2", 0);
  c.parallel.tp = 2;
  c.parallel.tp_plan = {"fc0=colwise", "fc1=rowwise"};
  const Params plain = paratrain::testing::train_ranks(c, 2);
  c.run.name = "mlp_tp2_recompute";
  c.train.activation_checkpointing = "every_k";
  c.train.checkpoint_every_k = 1;
  const Params recomputed = paratrain::testing::train_ranks(c, 2);
  EXPECT_EQ(relative_diff(recomputed, plain), 0.0);
  TrainConfig one = paratrain::testing::mlp_oracle_config(dir, "mlp_one", 0);
  const double diff = relative_diff(plain, paratrain::testing::one_process(one));
  std::printf("MLP at tp=2 (AdamW, 20 steps) vs one process: %.3g (tolerance 1e-5)\n", diff);
  EXPECT_LE(diff, 1e-5);
}

TEST(TpPlanTrainer, APlannedLayerCalledDirectlyStopsTheFirstStepNamingIt) {
  const std::string dir = paratrain::testing::temp_dir("tp-plan");
  std::mutex mu;
  std::string message;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    try {
      Trainer t(planned(lm_config(dir, "direct"), 2), g, lm_parts(/*call_sites=*/false));
      t.fit();
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      message = e.what();
    }
  });
  EXPECT_NE(message.find("'head' (colwise[gather])"), std::string::npos) << message;
  EXPECT_NE(message.find("parallelize::linear"), std::string::npos) << message;
}

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

TEST(TpPlanTrainer, MegatronSpWithoutEnteringTheSequenceSplitIsNamed) {
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

// The whole dp x tp x pp x cp mesh on the GPT through the Trainer (the
// megatron strategy with pipeline stages): context parallelism and
// Megatron-SP inside pipeline stages (boundaries carry this rank's sequence
// part), and ZeRO or FSDP on the replicas' axis. Each layout equals one process
// taking the same micro-batches (train.accumulate = 4) after 10 steps.
// gpt_pipeline_trainer_test.cpp covers tp x pp without a sequence split,
// megatron_trainer_test.cpp the layouts without stages.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/compare.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/config/config.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/strategies/strategy_registry.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/run_checks.h"
#include "tests/support/multi_rank.h"

namespace paratrain::train {
namespace {
namespace fs = std::filesystem;
using paratrain::testing::max_rel_diff;
using paratrain::testing::run_training;
using paratrain::testing::RunOutput;
using paratrain::testing::expect_config_error;
using paratrain::testing::last_train_record;

constexpr int kMicrobatches = 4;
// Note [GPT pipeline oracle tolerance] (gpt_pipeline_trainer_test.cpp) and
// Note [Megatron oracle tolerance] (megatron_trainer_test.cpp): the same
// float32 terms summed in another order (micro-batches, tp shards, ring
// steps, the tied copies, ZeRO's pieces), a few ulps after 10 SGD steps.
// Negative controls, measured by switching one piece off in the code and
// rerunning these tests: the embedding without its cp chunk's position
// offset 0.194 (pp2_cp2 and the full mesh), the tied copies' gradients not
// summed 0.899 (every layout with stages), the Megatron-SP LayerNorm
// gradients not summed over tp 0.48 (tp2_pp2_sp) and 0.469 (the full mesh):
// each far above this bound, so these comparisons can fail.
constexpr double kTolerance = 1e-5;

struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  bool sp = false;
  int zero = 0;
  int accumulate = 1;  // train.accumulate (no stages)
  int world() const { return dp * tp * pp * cp; }
};

class Mesh4d : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(paratrain::testing::temp_dir("mesh4d"));
    corpus_ = new fs::path(paratrain::testing::write_word_corpus(fs::path(*dir_) / "text", 777));
    // One process: the global batch of 8 as 4 accumulated micro-batches of 2.
    auto cfg = paratrain::testing::tiny_gpt_config(*dir_ + "/single", *corpus_);
    cfg.data.batch_size = 8 / kMicrobatches;
    cfg.train.accumulate = kMicrobatches;
    cfg.ddp.mode = "none";
    single_ = new RunOutput(run_training(cfg, 1));
  }
  static void TearDownTestSuite() {
    delete single_;
    delete corpus_;
    delete dir_;
  }

  // The same global batch of 8 and the same micro-batches: with stages,
  // pipeline.microbatches = 4 / dp; without, train.accumulate = 4 / dp.
  static TrainConfig config(const std::string& name, const Layout& l) {
    auto cfg = paratrain::testing::tiny_gpt_config(*dir_ + "/" + name, *corpus_);
    cfg.run.log_every = 5;  // metrics.jsonl records optimizer_bytes
    cfg.parallel.tp = l.tp;
    cfg.parallel.pp = l.pp;
    cfg.parallel.cp = l.cp;
    cfg.parallel.megatron_sp = l.sp;
    cfg.zero.stage = l.zero;
    // ZeRO-3: several units, gathered and freed one after another (the tied
    // head gathers wte's unit again after the blocks').
    cfg.zero.unit_min_params = 3000;
    cfg.data.batch_size = 8 / l.dp / l.accumulate;
    cfg.train.accumulate = l.accumulate;
    if (l.pp > 1) {
      cfg.pipeline.schedule = "1f1b";
      cfg.pipeline.microbatches = kMicrobatches / l.dp;
      cfg.pipeline.trace_steps = 0;
    }
    return cfg;
  }

  static RunOutput check(const std::string& name, const Layout& l) {
    const RunOutput multi = run_training(config(name, l), l.world());
    const double diff = max_rel_diff(multi.params, single_->params);
    std::printf("[ %s ] dp %d x tp %d x pp %d x cp %d%s%s on %d ranks vs 1 process: worst relative diff %.3g "
                "(tolerance %.0e)\n",
                name.c_str(), l.dp, l.tp, l.pp, l.cp, l.sp ? " + megatron_sp" : "",
                l.zero ? (" + zero " + std::to_string(l.zero)).c_str() : "", l.world(), diff, kTolerance);
    EXPECT_LE(diff, kTolerance);
    EXPECT_EQ(multi.result.steps, 10);
    EXPECT_NEAR(multi.result.test.loss, single_->result.test.loss, 1e-5 * single_->result.test.loss);
    return multi;
  }

  // The run's checkpoint consolidated equals the single process's:
  // parameters and SGD's momentum, each by its single-process name.
  static void expect_consolidates(const RunOutput& multi, const std::string& name) {
    paratrain::testing::expect_consolidates(multi, single_->result.last_checkpoint,
                                            fs::path(*dir_) / (name + ".safetensors"));
  }

  // `first` trained to step 5 and resumed at `then` to step 10 (the
  // checkpoint re-cut for the new layout) ends where one process does.
  static void expect_resumes(const std::string& name, const Layout& first, const Layout& then) {
    auto before = config(name, first);
    before.train.max_steps = 5;
    run_training(before, first.world());
    auto after = config(name, then);
    after.train.resume = "auto";
    const RunOutput resumed = run_training(after, then.world());
    EXPECT_EQ(resumed.result.start_step, 5);
    const double diff = max_rel_diff(resumed.params, single_->params);
    std::printf("[ %s resumed at another layout ] worst relative diff %.3g\n", name.c_str(), diff);
    EXPECT_LE(diff, kTolerance);
  }

  static std::string* dir_;
  static fs::path* corpus_;
  static RunOutput* single_;
};
std::string* Mesh4d::dir_ = nullptr;
fs::path* Mesh4d::corpus_ = nullptr;
RunOutput* Mesh4d::single_ = nullptr;

// Ring attention inside each stage's blocks over the cp group; each stage
// boundary carries this cp rank's chunk [b, S/cp, d] to the next stage's
// rank with the same cp coordinate; the last stage's loss is over the chunk.
TEST_F(Mesh4d, PipelineTimesContextParallelEqualsOneProcess) { check("pp2_cp2", {.pp = 2, .cp = 2}); }

// Interleaved 1F1B (two chunks per stage: one layer each) with ZeRO-1 over
// the cp replicas: one ZeroDataParallel per chunk, one optimizer over both
// chunks' pieces.
TEST_F(Mesh4d, InterleavedStagesWithContextParallelAndZeroEqualOneProcess) {
  auto cfg = config("pp2_v2_cp2_zero1", {.pp = 2, .cp = 2, .zero = 1});
  cfg.pipeline.schedule = "interleaved_1f1b";
  cfg.pipeline.virtual_stages = 2;
  const RunOutput multi = run_training(cfg, 4);
  const double diff = max_rel_diff(multi.params, single_->params);
  std::printf("[ pp2_v2_cp2_zero1 ] interleaved pp 2 x 2 chunks x cp 2 + zero 1: worst relative diff %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
  EXPECT_NEAR(multi.result.test.loss, single_->result.test.loss, 1e-5 * single_->result.test.loss);
}

// Megatron-SP inside stages: boundaries carry [b, S/tp, d] (Megatron-LM's
// sequence-parallel p2p), the embedding scatters, the head gathers, and the
// LayerNorms' partial gradients are summed over tp on each stage. It equals
// one process and plain tp 2 x pp 2 (the same weights up to rounding).
TEST_F(Mesh4d, MegatronSpWithStagesEqualsOneProcessAndPlainTensorPipeline) {
  const RunOutput sp = check("tp2_pp2_sp", {.tp = 2, .pp = 2, .sp = true});
  const RunOutput plain = check("tp2_pp2", {.tp = 2, .pp = 2});
  const double diff = max_rel_diff(sp.params, plain.params);
  std::printf("[ tp2_pp2_sp vs tp2_pp2 ] worst relative diff %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
}

// Every axis > 1 at its smallest: 16 thread-ranks, Megatron-SP on too (the
// sequence of 16 is cut into cp chunks of 8, each into tp parts of 4).
TEST_F(Mesh4d, FullMeshEqualsOneProcessAndConsolidates) {
  const RunOutput multi = check("dp2_tp2_pp2_cp2_sp", {.dp = 2, .tp = 2, .pp = 2, .cp = 2, .sp = true});
  expect_consolidates(multi, "dp2_tp2_pp2_cp2_sp");
}

// ZeRO-1 on the replicas' axis (dp x cp: the ranks holding the same shards):
// each replica steps its pieces of its tp shards. Equals one process and
// DDP (zero.stage = 0); the optimizer state per rank is about 1/dp of DDP's
// (the negative control: DDP's is the whole tensors').
TEST_F(Mesh4d, ZeroOneOnDataAxisEqualsOneProcessAndShardsOptimizerState) {
  const RunOutput zero = check("dp2_tp2_zero1", {.dp = 2, .tp = 2, .zero = 1});
  const RunOutput ddp = check("dp2_tp2_zero0", {.dp = 2, .tp = 2});
  const double diff = max_rel_diff(zero.params, ddp.params);
  const int64_t zero_bytes = last_train_record(zero, "optimizer_bytes"), ddp_bytes = last_train_record(ddp, "optimizer_bytes");
  std::printf("[ zero 1 vs zero 0 ] worst relative diff %.3g; rank 0 optimizer state %lld vs %lld bytes (%.3f)\n",
              diff, static_cast<long long>(zero_bytes), static_cast<long long>(ddp_bytes),
              static_cast<double>(zero_bytes) / ddp_bytes);
  EXPECT_LE(diff, kTolerance);
  ASSERT_GT(ddp_bytes, 0);
  // 1/dp plus at most one padding element per bucket and rank.
  EXPECT_LE(zero_bytes, ddp_bytes / 2 + 1024);
  EXPECT_GE(zero_bytes, ddp_bytes / 2 - 1024);
  expect_consolidates(zero, "dp2_tp2_zero1");
}

// A GPT in stages with ZeRO-1 and no tp or cp: routed to the megatron
// strategy (train::strategy_name), which shards around the tied copies.
TEST_F(Mesh4d, ZeroOneWithStagesAloneEqualsOneProcess) {
  EXPECT_EQ(strategy_name(config("dp2_pp2_zero1", {.dp = 2, .pp = 2, .zero = 1})), "megatron");
  check("dp2_pp2_zero1", {.dp = 2, .pp = 2, .zero = 1});
}

// ZeRO-2 (gradients reduce-scattered) without stages: with cp, and with
// Megatron-SP, whose LayerNorm gradients are summed over tp on the reduced
// pieces (every tp rank cuts the same pieces).
TEST_F(Mesh4d, ZeroTwoWithTensorContextAndSequenceParallelEqualsOneProcess) {
  check("dp2_tp2_cp2_zero2", {.dp = 2, .tp = 2, .cp = 2, .zero = 2});
  check("dp2_tp2_sp_zero2", {.dp = 2, .tp = 2, .sp = true, .zero = 2});
}

// ZeRO-1 with stages: the tied wte copies' and Megatron-SP's sums run in
// place on the full reduced gradients, of which the pieces are views.
TEST_F(Mesh4d, ZeroOneWithStagesAndSequenceParallelEqualsOneProcessAndConsolidates) {
  const RunOutput multi = check("dp2_tp2_pp2_sp_zero1", {.dp = 2, .tp = 2, .pp = 2, .sp = true, .zero = 1});
  expect_consolidates(multi, "dp2_tp2_pp2_sp_zero1");
}

// A ZeRO checkpoint written at one layout resumes at another: the pieces of
// dp 2 x tp 2 x pp 2 (momentum sharded over 2 replicas, tp shard segments)
// load into the pieces of dp 2 x tp 2 x cp 2 (sharded over 4 replicas).
TEST_F(Mesh4d, ZeroCheckpointResumesAtAnotherLayout) {
  expect_resumes("zero_resume", {.dp = 2, .tp = 2, .pp = 2, .zero = 1}, {.dp = 2, .tp = 2, .cp = 2, .zero = 1});
}

// FSDP (zero.stage = 3) on the replicas' axis, tp 2 x dp 2 with Megatron-SP:
// each tp rank's module fully sharded over its replicas (Note [FSDP over
// tensor-parallel shards] in strategies/replica_sync.cpp), the
// LayerNorms' partial gradients summed over tp on the pieces (switched off
// in the code: 0.48). Between steps rank 0 holds about half of ZeRO-1's
// parameter bytes (ZeRO-1 keeps this tp rank's shards whole); the
// checkpoint consolidates to the one process's.
TEST_F(Mesh4d, FsdpOnDataAxisWithSequenceParallelEqualsOneProcessAndShardsParameters) {
  EXPECT_EQ(strategy_name(config("dp2_tp2_sp_zero3", {.dp = 2, .tp = 2, .sp = true, .zero = 3})), "megatron");
  const RunOutput fsdp = check("dp2_tp2_sp_zero3", {.dp = 2, .tp = 2, .sp = true, .zero = 3});
  const RunOutput zero1 = check("dp2_tp2_sp_zero1", {.dp = 2, .tp = 2, .sp = true, .zero = 1});
  const int64_t fsdp_bytes = last_train_record(fsdp, "param_bytes");
  const int64_t zero1_bytes = last_train_record(zero1, "param_bytes");
  std::printf("[ zero 3 vs zero 1, dp2 x tp2 ] rank 0 parameters between steps %lld vs %lld bytes (%.3f)\n",
              static_cast<long long>(fsdp_bytes), static_cast<long long>(zero1_bytes),
              static_cast<double>(fsdp_bytes) / static_cast<double>(zero1_bytes));
  ASSERT_GT(zero1_bytes, 0);
  // 1/2, plus each unit's padding to a multiple of 2 elements.
  EXPECT_LE(fsdp_bytes, zero1_bytes / 2 + 256);
  EXPECT_GE(fsdp_bytes, zero1_bytes / 2 - 256);
  expect_consolidates(fsdp, "dp2_tp2_sp_zero3");
}

// FSDP over the cp ranks (tp 2 x cp 2: the replicas compute chunks of every
// sequence; units gathered inside ring attention's forward and backward),
// each step 2 accumulated micro-batches (no_sync, then one reduction).
// Its step-5 checkpoint (pieces of tp shards) resumes as ZeRO-1 at dp 2 x
// tp 2 and ends where one process does.
TEST_F(Mesh4d, FsdpWithContextParallelEqualsOneProcessAndResumesUnderZeroOne) {
  check("tp2_cp2_zero3", {.tp = 2, .cp = 2, .zero = 3, .accumulate = 2});
  expect_resumes("fsdp_resume", {.tp = 2, .cp = 2, .zero = 3}, {.dp = 2, .tp = 2, .zero = 1});
}

// Under FSDP an evaluation forward gathers units over the replicas, so a dp
// rank whose share is empty (the Trainer's last round) runs the forward
// with the others: at dp 2 x tp 2 x cp 2, dp rank 1 evaluates no rows while
// dp rank 0 evaluates 3, whose logits (gathered over tp and cp) equal the
// one-process GPT's.
TEST_F(Mesh4d, FsdpEvaluatesAnEmptyShareWithTheOtherReplicas) {
  const TrainConfig cfg = config("fsdp_eval", {.dp = 2, .tp = 2, .cp = 2, .zero = 3});
  const at::Tensor tokens = at::randint(0, 256, {3, cfg.model.seq_len}, at::TensorOptions().dtype(at::kLong));
  at::Tensor expected;
  {
    at::NoGradGuard no_grad;
    expected = seeded_model_factory(cfg, c10::Device(c10::kCPU))()->forward(tokens);
  }
  std::vector<double> diffs(8, -1.0);
  std::vector<int64_t> rows(8, -1);
  paratrain::testing::run_ranks(8, [&](comm::ProcessGroup& world) {
    topology::DeviceMesh mesh(world, topology::ParallelDims::resolve(0, 2, 1, 2, world.size()));
    auto strategy = make_strategy(strategy_name(cfg), StrategyContext{cfg, mesh, std::chrono::seconds(60)});
    strategy->build_model(seeded_model_factory(cfg, c10::Device(c10::kCPU)));
    const bool empty = mesh.group(topology::Axis::kDp).rank() == 1;
    at::NoGradGuard no_grad;
    const at::Tensor logits = strategy->eval_forward(empty ? tokens.slice(0, 0, 0) : tokens);
    rows[world.rank()] = logits.size(0);
    if (!empty) diffs[world.rank()] = (logits - expected).abs().max().item<double>();
  });
  for (int r = 0; r < 8; ++r) {
    const bool empty = (r / 4) % 2 == 1;  // ranks laid out (pp, dp, cp, tp)
    EXPECT_EQ(rows[r], empty ? 0 : 3) << "rank " << r;
    if (!empty) EXPECT_LT(diffs[r], 1e-5) << "rank " << r;
  }
}

// LARS and LAMB: every trust ratio from the norms of the single-process
// tensor, whose elements lie in tp shards, in ZeRO/FSDP pieces over the
// replicas, or whole on every tp rank (Note [LARS and LAMB across
// tensor-parallel shards] in strategies/megatron_layerwise.cpp). LAMB runs
// with eps 1e-3: with 1e-6 its Adam-like update carries the rounding of
// near-zero gradients into the weights (Note [Adam amplifies rounding] in
// megatron_trainer_test.cpp; measured 5e-5 to 9e-5), with 1e-3 3.7e-7.
// The trust ratios from this rank's shards alone (the tp sum switched off
// in the code): 7.9e-3 for both, so the bound sees them.
TEST_F(Mesh4d, LarsAndLambEqualOneProcessOverShardsPiecesAndStages) {
  for (const std::string kind : {"lars", "lamb"}) {
    auto optimizer = [&](TrainConfig c) {
      c.optimizer.kind = kind;
      if (kind == "lamb") {
        c.optimizer.lr = 3e-3;
        c.optimizer.momentum = 0;
        c.optimizer.eps = 1e-3;
      }
      return c;
    };
    const double tolerance = kTolerance;
    const RunOutput single = run_training(optimizer(config(kind + "_single", {})), 1);
    const std::vector<std::pair<std::string, Layout>> layouts = {
        {"dp2_tp2_sp_zero1", {.dp = 2, .tp = 2, .sp = true, .zero = 1}},
        {"tp2_cp2_zero3", {.tp = 2, .cp = 2, .zero = 3}},
        {"tp2_pp2", {.tp = 2, .pp = 2}}};
    for (const auto& [name, layout] : layouts) {
      const RunOutput multi = run_training(optimizer(config(kind + "_" + name, layout)), layout.world());
      const double diff = max_rel_diff(multi.params, single.params);
      std::printf("[ %s %s ] vs 1 process: worst relative diff %.3g (tolerance %.0e)\n", kind.c_str(), name.c_str(),
                  diff, tolerance);
      EXPECT_LE(diff, tolerance) << kind << " " << name;
    }
  }
}

TEST_F(Mesh4d, BadLayoutsAreConfigErrorsNamingEveryFactor) {
  expect_config_error(config("bad_zero2_pp", {.tp = 2, .pp = 2, .zero = 2}),
                      {"zero.stage = 2", "parallel.pp = 2", "parallel.megatron_sp = false", "parallel.tp = 2",
                       "parallel.cp = 1"});
  expect_config_error(config("bad_zero3", {.tp = 2, .pp = 2, .cp = 2, .zero = 3}),
                      {"zero.stage = 3", "parallel.pp = 2", "parallel.tp = 2", "parallel.cp = 2"});
  auto experts = config("bad_zero3_ep", {.dp = 2, .tp = 2, .zero = 3});
  experts.model.moe_experts = 4;
  experts.parallel.ep = 2;
  expect_config_error(experts, {"parallel.ep = 2", "zero.stage = 3"});
  // The sequence split inside stages: each cp chunk (12 / 4 = 3 tokens)
  // must split into tp parts.
  auto odd = config("bad_sp", {.tp = 2, .pp = 2, .cp = 4, .sp = true});
  odd.model.seq_len = 12;
  expect_config_error(odd, {"model.seq_len (12)", "parallel.cp (4)", "parallel.tp (2)"});
}

}  // namespace
}  // namespace paratrain::train

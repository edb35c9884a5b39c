// Tensor-parallel plans for a program's own model through the Trainer
// (parallel.tp_plan): the transformer of tiny_lm.h at tp=2, tp=2 x dp=2
// (with ZeRO-1) and with Megatron-SP equals one process on the same global
// batch (rtol 1e-5 after 10 SGD steps); a tp=2 checkpoint resumes on one
// process; evaluation over an uneven test set equals one process's; the
// planned MLP with activation checkpointing equals it without. Controls:
// one step less is told apart; a plan leaving the output split and a
// planned layer called directly stop the first step naming them.
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

TEST(TpPlanTrainer, AUserTransformerEqualsOneProcessAtTp2Tp2xDp2WithZeroOrFsdpAndWithMegatronSp) {
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
  // FSDP over the tp shards, every child with parameters its own unit, and
  // the sequence-parallel gradients summed over tp on its pieces.
  TrainConfig fsdp = planned(lm_config(dir, "tp2_dp2_fsdp_sp"), 2);
  fsdp.zero.stage = 3;
  fsdp.zero.unit_min_params = 1;
  fsdp.parallel.megatron_sp = true;
  const std::vector<Case> cases = {{"tp=2", 2, planned(lm_config(dir, "tp2"), 2)},
                                   {"tp=2 x dp=2", 4, planned(lm_config(dir, "tp2_dp2"), 2)},
                                   {"tp=2 x dp=2, ZeRO-1", 4, zero},
                                   {"tp=2 x dp=2, FSDP, Megatron-SP", 4, fsdp},
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


}  // namespace
}  // namespace paratrain::train

// train.activation_checkpointing through the Trainer: the GPT trained with
// its layers recomputed in backward equals, bitwise, the same run keeping
// every activation, under every strategy that runs it (DDP, ZeRO-3/FSDP,
// tensor parallelism with and without Megatron-SP, pipelines, tp x pp), and
// the recompute demonstrably ran. Ranks are threads here, so the multi-rank
// runs have dropout 0 (threads share the default generator); dropout's
// replay is checked in one process here and in real processes in
// activation_checkpointing_cli_test.cpp.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/models/recompute.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace paratrain::train {
namespace {
namespace fs = std::filesystem;

using paratrain::testing::run_training;

struct Layout {
  std::string name;
  int ranks = 1;
  std::function<void(TrainConfig&)> set;
  // Whole-model forwards per step over all ranks: a tp rank runs every
  // layer on its shard, a pipeline runs each micro-batch once across stages.
  int64_t passes = 1;
  bool stages = false;
};

std::vector<Layout> layouts() {
  return {
      {"one process, dropout 0.1", 1, [](TrainConfig& c) { c.model.dropout = 0.1; }, 1},
      {"ddp dp=2", 2, [](TrainConfig&) {}, 2},
      {"zero-2 dp=2", 2, [](TrainConfig& c) { c.zero.stage = 2; }, 2},
      {"zero-3 dp=2", 2, [](TrainConfig& c) { c.zero.stage = 3; }, 2},
      {"fsdp dp=2, no prefetch, kept after forward", 2,
       [](TrainConfig& c) {
         c.zero.stage = 3;
         c.zero.prefetch = false;
         c.zero.reshard_after_forward = false;
       },
       2},
      {"megatron tp=2", 2, [](TrainConfig& c) { c.parallel.tp = 2; }, 2},
      {"megatron tp=2 + sp", 2,
       [](TrainConfig& c) {
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
       },
       2},
      {"megatron tp=2 x dp=2, zero-3 + sp", 4,
       [](TrainConfig& c) {
         c.parallel.tp = 2;
         c.parallel.megatron_sp = true;
         c.zero.stage = 3;
         c.zero.unit_min_params = 3000;
       },
       4},
      {"pipeline pp=2 1f1b", 2,
       [](TrainConfig& c) {
         c.parallel.pp = 2;
         c.pipeline.schedule = "1f1b";
         c.pipeline.microbatches = 4;
       },
       4, true},
      {"pipeline pp=2 interleaved", 2,
       [](TrainConfig& c) {
         c.model.layers = 4;
         c.parallel.pp = 2;
         c.pipeline.schedule = "interleaved_1f1b";
         c.pipeline.virtual_stages = 2;
         c.pipeline.microbatches = 4;
       },
       4, true},
      {"megatron tp=2 x pp=2 gpipe", 4,
       [](TrainConfig& c) {
         c.parallel.tp = 2;
         c.parallel.pp = 2;
         c.pipeline.schedule = "gpipe";
         c.pipeline.microbatches = 2;
       },
       4, true},
  };
}

class ActivationCheckpointing : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = paratrain::testing::temp_dir("recompute");
    corpus_ = paratrain::testing::write_word_corpus(dir_, 777);
  }
  TrainConfig config(const std::string& name) const {
    TrainConfig c = paratrain::testing::tiny_gpt_config(dir_ + "/runs", corpus_);
    c.run.name = name;
    c.model.layers = 3;
    return c;
  }
  std::string dir_;
  fs::path corpus_;
};

TEST_F(ActivationCheckpointing, EqualsKeepingEveryActivationBitwiseUnderEveryLayout) {
  for (const auto& layout : layouts()) {
    SCOPED_TRACE(layout.name);
    TrainConfig plain = config("plain");
    layout.set(plain);
    const auto reference = run_training(plain, layout.ranks);
    for (const std::string mode : {"blocks", "every_k"}) {
      SCOPED_TRACE(mode);
      TrainConfig c = plain;
      c.run.name = mode;
      c.train.activation_checkpointing = mode;
      const int64_t before = models::recomputed_segments();
      const auto got = run_training(c, layout.ranks);
      // The control: every segment of every forward was recomputed once. The
      // recomputed layers are all but the head: embed and the blocks; in
      // "every_k" pairs of them, which a stage boundary may cut in two.
      const int64_t layers = c.model.layers + 1;
      const int64_t recomputed = models::recomputed_segments() - before;
      const int64_t per_pass = mode == "blocks" ? layers : (layers + 1) / 2;
      if (mode == "blocks" || !layout.stages) {
        EXPECT_EQ(recomputed, per_pass * layout.passes * c.train.max_steps);
      } else {
        EXPECT_GE(recomputed, per_pass * layout.passes * c.train.max_steps);
        EXPECT_LE(recomputed, layers * layout.passes * c.train.max_steps);
      }
      ASSERT_EQ(got.params.size(), reference.params.size());
      for (size_t i = 0; i < got.params.size(); ++i) {
        EXPECT_TRUE(torch::equal(got.params[i].second, reference.params[i].second))
            << got.params[i].first << " differs by "
            << (got.params[i].second - reference.params[i].second).abs().max().item<double>();
      }
      EXPECT_EQ(got.result.last_train_loss, reference.result.last_train_loss);
    }
  }
}

TEST_F(ActivationCheckpointing, DropoutChangesTheRunSoTheReplayIsTested) {
  // Without the replay a recompute would draw new masks; the one-process
  // case above would then differ. Make sure dropout draws at all here.
  TrainConfig a = config("a"), b = config("b");
  a.model.dropout = 0.1;
  b.model.dropout = 0.0;  // the same weights and batches, no masks
  const auto x = run_training(a, 1), y = run_training(b, 1);
  EXPECT_NE(x.result.last_train_loss, y.result.last_train_loss);
}

TEST_F(ActivationCheckpointing, ChoosesLayersByPatternAndRefusesWhatCannotWork) {
  TrainConfig c = config("pattern");
  c.train.activation_checkpointing = "blocks";
  c.train.checkpoint_layers = {"blocks.*"};
  const int64_t before = models::recomputed_segments();
  run_training(c, 1);
  EXPECT_EQ(models::recomputed_segments() - before, 3 * c.train.max_steps);  // 3 blocks, not embed

  TrainConfig bad = config("bad");
  bad.train.activation_checkpointing = "blocks";
  bad.train.checkpoint_layers = {"block.*"};
  try {
    run_training(bad, 1);
    ADD_FAILURE() << "a pattern matching no layer was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"block.*\" matches none"), std::string::npos) << e.what();
  }

  TrainConfig qat = config("qat");
  qat.train.activation_checkpointing = "blocks";
  qat.quant.qat = true;
  try {
    validate_config(qat);
    ADD_FAILURE() << "QAT with activation checkpointing was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("quant.qat"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace paratrain::train

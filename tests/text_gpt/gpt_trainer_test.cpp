// The GPT through the Trainer on a small temporary corpus: 2 DDP ranks (and
// ZeRO stages) equal one process on the same global batch; the language-model
// objective; the config rules; generating from the saved checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "paratrain/core/error.h"
#include "paratrain/models/gpt.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/generate.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/task.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace paratrain::train {
namespace {
namespace fs = std::filesystem;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

fs::path write_corpus(const fs::path& dir) { return paratrain::testing::write_word_corpus(dir, 12345); }

// The shared tiny GPT (gpt_run.h) trained by AdamW without clipping, on one
// process by default, 16 windows per step for 6 steps.
TrainConfig gpt_config(const std::string& out, const fs::path& corpus) {
  TrainConfig c = paratrain::testing::tiny_gpt_config(out, corpus);
  const TrainConfig defaults;
  c.run.seed = 3;
  c.data.batch_size = 16;
  c.optimizer.kind = "adamw";
  c.optimizer.lr = 3e-3;
  c.optimizer.momentum = defaults.optimizer.momentum;
  c.optimizer.clip_grad_norm = defaults.optimizer.clip_grad_norm;
  c.train.max_steps = 6;
  c.ddp.mode = "none";
  return c;
}

using paratrain::testing::run_training;
using paratrain::testing::RunOutput;

double max_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    m = std::max(m, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return m;
}

// Note [GPT oracle tolerance]
// Per-rank mean losses averaged by the all-reduce sum the same float32 terms
// as one process's mean over the global batch, in another order: gradients
// differ by a few ulps. AdamW divides by sqrt(v), so after 6 steps at lr
// 3e-3 weights (|w| ~ 0.02..1) differ by ~1e-7 (measured below 1e-6);
// 1e-5 absolute is far below the 1e-3 gap of unsynchronised training.
constexpr double kTolerance = 1e-5;

TEST(GptTrainer, TwoRanksEqualOneProcessOnTheSameGlobalBatch) {
  const auto dir = paratrain::testing::temp_dir("gpt_trainer");
  const auto corpus = write_corpus(fs::path(dir) / "text");

  auto single_cfg = gpt_config(dir + "/single", corpus);
  const RunOutput single = run_training(single_cfg, 1);
  EXPECT_EQ(single.result.steps, 6);
  // Evaluated at the stop (mid-epoch): per-token loss and perplexity.
  EXPECT_GT(single.result.test.count, 0);
  EXPECT_EQ(single.result.test.count % 16, 0);
  EXPECT_NEAR(single.result.test.perplexity, std::exp(single.result.test.loss), 1e-9);
  // Training lowered the loss from ln(256) = 5.55 (uniform bytes).
  EXPECT_LT(single.result.test.loss, 5.0);

  for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    SCOPED_TRACE(strategy);
    auto cfg = gpt_config(dir + "/" + strategy, corpus);
    cfg.data.batch_size = 8;
    cfg.ddp.mode = "bucketed";
    cfg.zero.stage = strategy == "ddp" ? 0 : strategy.back() - '0';
    // ZeRO-3: several units, so the tied head gathers wte's unit again
    // after the blocks' units ran.
    cfg.zero.unit_min_params = 5000;
    const RunOutput multi = run_training(cfg, 2);
    const double diff = max_diff(multi.params, single.params);
    std::printf("[ %s ] 2 ranks vs 1 process: max |diff| %.3g after 6 steps\n", strategy.c_str(), diff);
    EXPECT_LT(diff, kTolerance);
    EXPECT_EQ(multi.result.test.count, single.result.test.count);
    EXPECT_NEAR(multi.result.test.loss, single.result.test.loss, 1e-5);
  }

  // Negative control: one rank on its half batch, without the all-reduce.
  auto alone_cfg = gpt_config(dir + "/alone", corpus);
  alone_cfg.data.batch_size = 8;
  const double alone = max_diff(run_training(alone_cfg, 1).params, single.params);
  std::printf("[ alone ] half batch without synchronisation: max |diff| %.3g\n", alone);
  EXPECT_GT(alone, 100 * kTolerance);
}

TEST(GptTrainer, GeneratesFromTheSavedCheckpoint) {
  const auto dir = paratrain::testing::temp_dir("gpt_generate");
  const auto corpus = write_corpus(fs::path(dir) / "text");
  auto cfg = gpt_config(dir + "/run", corpus);
  cfg.train.max_steps = 2;
  const RunOutput run = run_training(cfg, 1);
  ASSERT_FALSE(run.result.last_checkpoint.empty());

  const TrainConfig loaded_cfg = config_for_checkpoint(run.result.last_checkpoint);
  EXPECT_EQ(loaded_cfg.model, cfg.model);
  auto model = load_model_for_inference(loaded_cfg, run.result.last_checkpoint);
  const auto named = model->named_parameters();
  for (const auto& [name, value] : run.params) EXPECT_TRUE(torch::equal(named[name], value)) << name;

  SamplingOptions o;
  o.tokens = 40;  // longer than seq_len: the context is cropped
  o.seed = 5;
  const std::string a = generate(*model, cfg.model.seq_len, "the cat", o);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(generate(*model, cfg.model.seq_len, "the cat", o), a);  // same seed, same text
  o.temperature = 0;
  const std::string greedy = generate(*model, cfg.model.seq_len, "the cat", o);
  o.temperature = 1.0;
  o.top_k = 1;
  o.seed = 99;
  EXPECT_EQ(generate(*model, cfg.model.seq_len, "the cat", o), greedy);  // top-1 sampling is greedy
  o.top_k = 300;
  EXPECT_THROW(generate(*model, cfg.model.seq_len, "x", o), ConfigError);
  EXPECT_THROW(config_for_checkpoint(fs::path(dir) / "nowhere" / "step_1"), ConfigError);
}

TEST(LanguageModelTask, LossIsTheMeanTokenCrossEntropy) {
  torch::manual_seed(0);
  auto logits = torch::randn({2, 3, 5});
  auto targets = torch::randint(0, 5, {2, 3}, torch::kLong);
  const auto lm = language_model_task(3);
  double manual = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 3; ++t)
      manual -= torch::log_softmax(logits[b][t], 0)[targets[b][t].item<int64_t>()].item<double>();
  EXPECT_NEAR(lm->loss(logits, targets.to(torch::kByte)).item<double>(), manual / 6, 1e-5);
  const EvalSums sums = lm->eval_sums(logits, targets);
  EXPECT_NEAR(sums.get("loss"), manual, 1e-4);
  EXPECT_EQ(sums.count, 6);
  EXPECT_EQ(sums.get("accuracy"), logits.argmax(2).eq(targets).sum().item<double>());
  EXPECT_THROW(lm->loss(logits.reshape({6, 5}), targets), c10::Error);
  EXPECT_EQ(classification_task()->eval_sums(logits[0], targets[0]).count, 3);
  // Perplexity is exp of the reduced test loss.
  const auto derived = lm->derived({{"test_loss", 2.0}, {"test_accuracy", 0.5}});
  ASSERT_EQ(derived.size(), 1u);
  EXPECT_EQ(derived[0].first, "perplexity");
  EXPECT_NEAR(derived[0].second, std::exp(2.0), 1e-12);
}

TEST(GptConfig, RulesNameTheKeys) {
  const auto expect_error = [](TrainConfig c, const std::string& needle) {
    try {
      validate_config(c);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainConfig c = gpt_config("runs", "/tmp/x");
  EXPECT_NO_THROW(validate_config(c));
  auto bad = c;
  bad.model.heads = 5;
  expect_error(bad, "model.heads");
  bad = c;
  bad.data.dataset = "synthetic";
  expect_error(bad, "data.dataset");
  bad = c;
  bad.model.kind = "mlp";
  expect_error(bad, "model.kind");
  bad = c;
  bad.parallel.pp = c.model.layers + 3;  // more stages than embed + blocks + head
  expect_error(bad, "parallel.pp");
  bad.parallel.pp = c.model.layers + 2;  // one layer per stage
  EXPECT_NO_THROW(validate_config(bad));
  // The keys parse from TOML with their exact names.
  const auto parsed = config_from_toml_string(
      "[model]\nkind = \"gpt\"\nlayers = 3\nd_model = 48\nheads = 6\nseq_len = 32\ndropout = 0.2\n"
      "[data]\ndataset = \"text\"\npath = \"/tmp/corpus\"\n");
  EXPECT_EQ(parsed.model.layers, 3);
  EXPECT_EQ(parsed.model.d_model, 48);
  EXPECT_EQ(parsed.model.heads, 6);
  EXPECT_EQ(parsed.model.seq_len, 32);
  EXPECT_DOUBLE_EQ(parsed.model.dropout, 0.2);
  EXPECT_EQ(parsed.data.path, "/tmp/corpus");
  // parameter_count (the Trainer's log line, `paratrain plan`) matches the model.
  torch::manual_seed(0);
  int64_t numel = 0;
  for (const auto& p : make_model(parsed)->parameters()) numel += p.numel();
  EXPECT_EQ(numel, 256 * 48 + 32 * 48 + 3 * (12 * 48 * 48 + 13 * 48) + 2 * 48);
  EXPECT_EQ(parameter_count(parsed), numel);
}

}  // namespace
}  // namespace paratrain::train

// The activation planner (train/activation_plan.h) against measurement: a
// forward and its loss on the built model, the bytes that stay allocated
// until backward counted by the memory meter (core/memory_meter.h), for the
// MLP, the CNN (with and without BatchNorm) and the GPT at two sizes, with
// and without dropout and activation checkpointing. Also the meter itself,
// and pipelines' in-flight micro-batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>

#include "paratrain/core/error.h"
#include "paratrain/core/memory_meter.h"
#include "paratrain/models/recompute.h"
#include "paratrain/train/activation_plan.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"

namespace pt = paratrain::train;
namespace core = paratrain::core;

namespace {

// What one micro-batch's forward and loss leave allocated for backward,
// the batch and its targets included (the planner counts them).
int64_t measured_kept(const pt::TrainConfig& c) {
  core::install_memory_meter();
  torch::manual_seed(0);
  std::shared_ptr<paratrain::models::Model> model = pt::make_model(c);
  if (c.train.activation_checkpointing != "none")
    model = std::make_shared<paratrain::models::RecomputedModel>(model, pt::recompute_policy(c));
  model->train();
  const int64_t rows = c.data.batch_size;
  const int64_t before = core::memory_meter().live_bytes;
  at::Tensor x, y, logits;
  if (pt::builds_gpt(c)) {
    x = torch::randint(0, 256, {rows, c.model.seq_len}, torch::kLong);
    y = torch::randint(0, 256, {rows, c.model.seq_len}, torch::kLong);
    logits = model->forward(x);
    logits = logits.reshape({-1, logits.size(-1)});
  } else {
    const int64_t side = c.data.synthetic_image_size, ch = c.data.synthetic_channels;
    x = torch::randn({rows, ch, side, side});
    y = torch::randint(0, c.data.synthetic_classes, {rows}, torch::kLong);
    logits = model->forward(x);
  }
  const at::Tensor loss = torch::nn::functional::cross_entropy(logits, y.reshape({-1}));
  return core::memory_meter().live_bytes - before;
}

pt::TrainConfig images(const std::string& toml) {
  return pt::config_from_toml_string(
      "[data]\ndataset = \"synthetic\"\nsynthetic_channels = 3\nsynthetic_image_size = 16\n"
      "synthetic_classes = 10\nbatch_size = 32\n" + toml);
}

pt::TrainConfig gpt(int64_t layers, int64_t d, int64_t heads, int64_t seq, double dropout, int64_t rows) {
  return pt::config_from_toml_string(fmt::format(
      "[data]\ndataset = \"text\"\npath = \"/usr/share/games/fortunes\"\nbatch_size = {}\n"
      "[model]\nkind = \"gpt\"\nlayers = {}\nd_model = {}\nheads = {}\nseq_len = {}\ndropout = {}\n",
      rows, layers, d, heads, seq, dropout));
}

void expect_close(const pt::TrainConfig& c, const std::string& what, double tolerance = 0.005) {
  const auto plan = pt::plan_activations(c, 1);
  ASSERT_TRUE(plan.modelled);
  const int64_t measured = measured_kept(c);
  const double ratio = static_cast<double>(plan.kept_bytes) / static_cast<double>(measured);
  std::printf("[ measured ] %-40s predicted %10lld B, measured %10lld B, ratio %.3f\n", what.c_str(),
              static_cast<long long>(plan.kept_bytes), static_cast<long long>(measured), ratio);
  EXPECT_NEAR(ratio, 1.0, tolerance) << what << ": predicted " << plan.kept_bytes << ", measured " << measured;
}

}  // namespace

TEST(MemoryMeter, CountsLiveAndPeakBytesInsideItsWindow) {
  core::install_memory_meter();
  ASSERT_TRUE(core::memory_meter_installed());
  core::begin_memory_window();
  const auto start = core::memory_meter();
  EXPECT_EQ(start.peak_bytes, start.live_bytes);
  {
    at::Tensor big = torch::empty({1 << 20});  // 4 MiB
    EXPECT_EQ(core::memory_meter().live_bytes - start.live_bytes, 4 << 20);
  }
  const auto after = core::memory_meter();
  EXPECT_EQ(after.live_bytes, start.live_bytes);
  EXPECT_EQ(after.peak_bytes - after.baseline_bytes, 4 << 20);
  core::end_memory_window();
  { at::Tensor bigger = torch::empty({1 << 21}); }
  EXPECT_EQ(core::memory_meter().peak_bytes - after.baseline_bytes, 4 << 20) << "a closed window moved its peak";
}

TEST(ActivationPlan, MlpAndCnnMatchWhatTheirForwardKeeps) {
  expect_close(images("[model]\nkind = \"mlp\"\nhidden = [256, 128]\n"), "mlp 768-256-128-10, batch 32");
  expect_close(images("[model]\nkind = \"cnn\"\nchannels = [8, 16]\ncnn_hidden = 64\n"), "cnn [8, 16] fc 64");
  expect_close(images("[model]\nkind = \"cnn\"\nchannels = [8, 16]\ncnn_hidden = 64\nbatchnorm = true\n"),
               "cnn with batchnorm");
}

TEST(ActivationPlan, GptMatchesWhatItsForwardKeepsAtTwoSizes) {
  expect_close(gpt(2, 64, 4, 32, 0.0, 4), "gpt 2x64, seq 32, no dropout");
  expect_close(gpt(2, 64, 4, 32, 0.1, 4), "gpt 2x64, seq 32, dropout");
  expect_close(gpt(3, 128, 8, 64, 0.1, 2), "gpt 3x128, seq 64, dropout");
}

TEST(ActivationPlan, ActivationCheckpointingKeepsWhatTheFormulaSays) {
  auto blocks = gpt(4, 64, 4, 32, 0.1, 4);
  blocks.train.activation_checkpointing = "blocks";
  expect_close(blocks, "gpt 4x64 recomputing blocks");
  auto every2 = blocks;
  every2.train.activation_checkpointing = "every_k";
  expect_close(every2, "gpt 4x64 recomputing every 2");
  const auto plain = pt::plan_activations(gpt(4, 64, 4, 32, 0.1, 4), 1);
  const auto recomputed = pt::plan_activations(blocks, 1);
  EXPECT_LT(recomputed.kept_bytes * 5, plain.kept_bytes);
  EXPECT_EQ(recomputed.unrecomputed_bytes, plain.kept_bytes);
  EXPECT_GT(recomputed.recompute_bytes, 0);
}

TEST(ActivationPlan, PipelinesHoldTheirScheduleInFlightMicroBatches) {
  auto c = pt::config_from_toml_string(
      "[data]\ndataset = \"synthetic\"\nbatch_size = 64\n[model]\nhidden = [64, 64, 64]\n"
      "[parallel]\npp = 4\n[pipeline]\nmicrobatches = 8\nschedule = \"gpipe\"\n");
  const auto gpipe = pt::plan_activations(c, 1);
  EXPECT_EQ(gpipe.microbatch_rows, 8);
  EXPECT_EQ(gpipe.in_flight, 8);  // every micro-batch's forward before any backward
  c.pipeline.schedule = "1f1b";
  const auto one_f_one_b = pt::plan_activations(c, 1);
  EXPECT_EQ(one_f_one_b.in_flight, 4);  // at most pp on the first stage
  EXPECT_EQ(one_f_one_b.stage, 0);
  EXPECT_LT(one_f_one_b.total_bytes, gpipe.total_bytes);
}

TEST(ActivationPlan, AHugeModelWithALongContextIsAClearErrorNotAWrappedCount) {
  // A 6.5B GPT with a 1M-token context at batch 1024: every value is inside
  // the config's bounds, the activations are not inside 64 bits.
  auto c = gpt(32, 4096, 32, 2048, 0.0, 1024);
  c.model.seq_len = 1 << 20;
  try {
    const auto plan = pt::plan_activations(c, 8);
    EXPECT_GT(plan.total_bytes, 0);  // if it fits, it is a positive count
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("overflow a 64-bit count"), std::string::npos) << e.what();
  }
  c = gpt(32, 4096, 32, 2048, 0.0, 8);  // an ordinary 7B layout: a sane count
  const auto plan = pt::plan_activations(c, 8);
  EXPECT_GT(plan.total_bytes, int64_t{1} << 30);
  EXPECT_LT(plan.total_bytes, int64_t{1} << 40);
}

TEST(ActivationPlan, APipelineStageKeepsTheOutputItSentAndItsRecomputeKeepsOnlyInputs) {
  auto c = pt::config_from_toml_string(
      "[data]\ndataset = \"synthetic\"\nbatch_size = 512\n[model]\nhidden = [512, 512, 512]\n"
      "[parallel]\npp = 2\n[pipeline]\nmicrobatches = 8\nschedule = \"gpipe\"\nsplit = [2, 2]\n");
  const auto layers = pt::layer_activations(c, 64);
  ASSERT_EQ(layers.size(), 4u);
  const auto plan = pt::plan_activations(c, 1);
  // Stage 0 holds fc0, fc1 and the output it sent (fc2's input).
  const int64_t stage0 = layers[0].input_bytes + layers[0].saved_bytes + layers[1].input_bytes +
                         layers[1].saved_bytes + layers[2].input_bytes;
  const int64_t stage1 = layers[2].input_bytes + layers[2].saved_bytes + layers[3].input_bytes + layers[3].saved_bytes;
  EXPECT_EQ(plan.kept_bytes, plan.stage == 0 ? stage0 : stage1);
  c.pipeline.checkpoint_activations = true;
  const auto recomputed = pt::plan_activations(c, 1);
  EXPECT_LT(recomputed.kept_bytes, plan.kept_bytes);
  EXPECT_GT(recomputed.recompute_bytes, 0);
}

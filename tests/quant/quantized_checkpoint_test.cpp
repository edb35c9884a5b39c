// Post-training quantization of a checkpoint (train/inference/trained_model.h):
// the int8 file's format (Note [The int8 file]) round-trips, its model
// evaluates as `paratrain evaluate` reports, close to the float model, and a
// damaged or mismatched file is named in the error. The float checkpoint is
// a sharded one, saved at 2 ranks under ZeRO-2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/core/error.h"
#include "paratrain/train/generate.h"
#include "paratrain/train/inference/trained_model.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;

// A 2-layer MLP trained 40 steps on synthetic 8x8 images at 2 ranks, with
// an evaluation at the end (its figures are the run's own).
struct Trained {
  std::filesystem::path checkpoint;
  double accuracy = 0, loss = 0;
};

const Trained& trained_run() {
  static const Trained run = [] {
    auto dir = paratrain::testing::temp_dir("quant_run");
    TrainConfig c;
    c.run.name = "mlp";
    c.run.output_dir = dir;
    c.run.seed = 4;
    c.model.kind = "mlp";
    c.model.hidden = {32};
    c.data.dataset = "synthetic";
    c.data.synthetic_train_size = 640;
    c.data.synthetic_test_size = 256;
    c.data.synthetic_image_size = 8;
    c.data.global_batch_size = 32;
    c.optimizer.kind = "adam";
    c.optimizer.lr = 0.01;
    c.train.epochs = 2;
    c.zero.stage = 2;
    Trained out;
    paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
      paratrain::train::Trainer t(c, g);
      const auto r = t.fit();
      if (g.rank() == 0) {
        out.checkpoint = r.last_checkpoint;
        out.accuracy = r.test.accuracy;
        out.loss = r.test.loss;
      }
    });
    return out;
  }();
  return run;
}

TEST(QuantizedCheckpoint, TheInt8FileHoldsInt8WeightsWithScalesAndEvaluatesCloseToTheFloatModel) {
  const Trained& run = trained_run();
  auto dir = paratrain::testing::temp_dir("quant_file");
  // The float checkpoint evaluates as the run did at its end.
  const auto float_model = paratrain::train::load_trained_model(run.checkpoint);
  EXPECT_FALSE(float_model.quantized);
  const auto float_eval = paratrain::train::evaluate_trained_model(float_model);
  EXPECT_DOUBLE_EQ(float_eval.accuracy, run.accuracy);
  EXPECT_NEAR(float_eval.loss, run.loss, 1e-6);

  for (bool per_tensor : {false, true}) {
    const auto out = std::filesystem::path(dir) / (per_tensor ? "t.int8.safetensors" : "c.int8.safetensors");
    paratrain::train::QuantizeOptions options;
    if (per_tensor) options.granularity = paratrain::quant::Granularity::kPerTensor;
    const auto report = paratrain::train::quantize_checkpoint(run.checkpoint, out, options);
    EXPECT_EQ(report.quantized, (std::vector<std::string>{"fc0.weight", "fc1.weight"}));
    EXPECT_LT(report.file_bytes * 3, report.float_bytes);  // weights are most of it: > 3x smaller

    const auto file = paratrain::checkpoint::read_safetensors(out);
    EXPECT_EQ(file.tensors.at("model/fc0.weight").scalar_type(), at::kChar);
    EXPECT_EQ(file.tensors.at("model/fc0.bias").scalar_type(), at::kFloat);
    EXPECT_EQ(file.tensors.at("scale/fc0.weight").numel(), per_tensor ? 1 : 32);
    EXPECT_EQ(file.metadata.at("quant.format"), "paratrain-int8-v1");
    EXPECT_EQ(file.metadata.at("quant.granularity"), per_tensor ? "per_tensor" : "per_channel");
    EXPECT_EQ(file.tensors.count("optimizer/fc0.weight/exp_avg"), 0u);

    // Loaded back: every weight within half a step of the float one.
    const auto int8 = paratrain::train::load_trained_model(out);
    EXPECT_TRUE(int8.quantized);
    const auto f = float_model.model->named_parameters();
    const auto q = int8.model->named_parameters();
    for (const std::string name : {"fc0.weight", "fc1.weight"}) {
      const at::Tensor scale = file.tensors.at("scale/" + name);
      const at::Tensor half = (per_tensor ? scale.reshape({}) : scale.reshape({-1, 1})) / 2;
      EXPECT_TRUE(((q[name] - f[name]).abs() <= half * (1 + 1e-6)).all().item<bool>()) << name;
      EXPECT_FALSE(torch::equal(q[name], f[name])) << name;
    }
    EXPECT_TRUE(torch::equal(q["fc0.bias"], f["fc0.bias"]));
    const auto int8_eval = paratrain::train::evaluate_trained_model(int8);
    std::cout << "[quant] " << (per_tensor ? "per tensor" : "per channel") << ": accuracy " << int8_eval.accuracy
              << " vs float " << float_eval.accuracy << ", " << report.float_bytes << " -> " << report.file_bytes
              << " bytes\n";
    EXPECT_NEAR(int8_eval.accuracy, float_eval.accuracy, 0.02);
  }
}

// An int8 GPT file away from its run: generate finds the config in the
// file's metadata and samples from the dequantized weights, whose logits are
// the float model's to within a few percent of their spread.
TEST(QuantizedCheckpoint, AnInt8GptGeneratesFromItsFileAlone) {
  auto dir = paratrain::testing::temp_dir("quant_gpt");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 7);
  auto c = paratrain::testing::tiny_gpt_config(dir, corpus);
  c.train.max_steps = 8;
  const auto run = paratrain::testing::run_training(c, 1);
  const auto checkpoint = run.result.last_checkpoint;
  const auto file = std::filesystem::path(dir) / "elsewhere" / "gpt.int8.safetensors";
  std::filesystem::create_directories(file.parent_path());
  paratrain::train::quantize_checkpoint(checkpoint, file);
  const auto config = paratrain::train::config_for_checkpoint(file);
  EXPECT_EQ(config.model.kind, "gpt");
  EXPECT_EQ(config.model.d_model, 32);
  paratrain::train::SamplingOptions greedy;
  greedy.tokens = 24;
  greedy.temperature = 0;
  const auto int8_model = paratrain::train::load_model_for_inference(config, file);
  const auto float_model = paratrain::train::load_model_for_inference(config, checkpoint);
  const std::string from_int8 = paratrain::train::generate(*int8_model, config.model.seq_len, "the ", greedy);
  EXPECT_EQ(from_int8.size(), 24u);
  torch::NoGradGuard no_grad;
  const at::Tensor window = torch::tensor({116, 104, 101, 32}, torch::kLong).unsqueeze(0);  // "the "
  const at::Tensor a = int8_model->forward(window), b = float_model->forward(window);
  const double spread = (b.max() - b.min()).item<double>();
  EXPECT_GT((a - b).abs().max().item<double>(), 0.0);  // it is quantized
  EXPECT_LT((a - b).abs().max().item<double>(), 0.05 * spread);
}

TEST(QuantizedCheckpoint, DamagedOrMismatchedFilesAreNamed) {
  const Trained& run = trained_run();
  auto dir = paratrain::testing::temp_dir("quant_bad");
  const auto good = std::filesystem::path(dir) / "good.int8.safetensors";
  paratrain::train::quantize_checkpoint(run.checkpoint, good);
  // Quantizing twice, or to 9 bits, is refused.
  EXPECT_THROW(paratrain::train::quantize_checkpoint(good, std::filesystem::path(dir) / "again.safetensors"),
               paratrain::ConfigError);
  paratrain::train::QuantizeOptions nine;
  nine.bits = 9;
  EXPECT_THROW(paratrain::train::quantize_checkpoint(run.checkpoint, std::filesystem::path(dir) / "nine", nine),
               c10::Error);
  // A weight whose scales are gone.
  auto file = paratrain::checkpoint::read_safetensors(good);
  file.tensors.erase("scale/fc1.weight");
  const auto no_scale = std::filesystem::path(dir) / "no_scale.safetensors";
  paratrain::checkpoint::write_safetensors(no_scale, file);
  try {
    paratrain::train::load_trained_model(no_scale);
    FAIL() << "expected CheckpointError";
  } catch (const paratrain::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("scale/fc1.weight"), std::string::npos) << e.what();
  }
  // Scales of the wrong count.
  file = paratrain::checkpoint::read_safetensors(good);
  file.tensors["scale/fc1.weight"] = torch::ones({3});
  const auto bad_scales = std::filesystem::path(dir) / "bad_scales.safetensors";
  paratrain::checkpoint::write_safetensors(bad_scales, file);
  EXPECT_THROW(paratrain::train::load_trained_model(bad_scales), paratrain::CheckpointError);
  // A flipped byte: the file's checksum names it.
  const auto flipped = std::filesystem::path(dir) / "flipped.safetensors";
  std::filesystem::copy_file(good, flipped);
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_THROW(paratrain::train::load_trained_model(flipped), paratrain::CheckpointError);
}

}  // namespace

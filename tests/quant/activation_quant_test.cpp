// Activation quantization (quant/activations.h, Note [Activation sites];
// docs/quantization.md):
// - the grid of a range (unsigned for a nonnegative one, symmetric
//   otherwise), fake quantization on it and its straight-through gradient;
// - layer_input is the identity with no observer, and observers nest;
// - calibration records each layer's input range, by name;
// - an int8 file with static activations runs exactly the forward its ranges
//   describe (checked against the forward written out by hand), dynamic and
//   none files load and evaluate close to the float model, and a missing
//   range is named;
// - int8 kernels (Note [Int8 kernels]): this LibTorch has oneDNN; a Linear
//   run on it (2-D and 3-D inputs) is within the quantization error of the
//   float Linear, and a dynamic file evaluates on it close to simulated;
// - QAT with quant.activation_bits: 2 ranks equal one process over 3 steps
//   (ranges included: Note [Learned activation ranges]), the activations
//   really are quantized (a control without them ends elsewhere), and
//   `paratrain quantize` of the run writes its learned ranges and evaluates
//   as the run did.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/quant/activation_observers.h"
#include "paratrain/quant/activations.h"
#include "paratrain/quant/int8_kernels.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/inference/trained_model.h"
#include "paratrain/train/qat/fake_quant_model.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/support/small_mlp.h"
#include "tests/support/trainer_oracle.h"

namespace {

namespace quant = paratrain::quant;
namespace fs = std::filesystem;
using paratrain::train::TrainConfig;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

TEST(ActivationQuant, GridsFakeQuantizationAndTheStraightThroughGradient) {
  const auto relu = quant::activation_grid({0.0f, 2.55f}, 8);
  EXPECT_EQ(relu.lo, 0);
  EXPECT_EQ(relu.hi, 255);
  EXPECT_NEAR(relu.scale, 0.01, 1e-9);
  const auto signed_grid = quant::activation_grid({-3.0f, 1.27f}, 8);
  EXPECT_EQ(signed_grid.lo, -127);
  EXPECT_EQ(signed_grid.hi, 127);
  EXPECT_NEAR(signed_grid.scale, 3.0 / 127, 1e-9);
  EXPECT_EQ(quant::activation_grid({0, 0}, 8).scale, 1.0);
  EXPECT_THROW(quant::activation_grid({0, 1}, 9), c10::Error);

  auto x = torch::tensor({-0.5f, 0.004f, 0.006f, 1.0f, 2.55f, 3.0f}, torch::requires_grad());
  const auto y = quant::fake_quantize_grid(x, relu);
  const auto expected = torch::tensor({0.0f, 0.0f, 0.01f, 1.0f, 2.55f, 2.55f});
  EXPECT_TRUE(torch::allclose(y, expected, 0, 1e-6)) << y;
  y.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::tensor({0.0f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0f}))) << x.grad();
}

// Returns its input times 2 for one layer, records who asked.
struct Doubler final : quant::ActivationObserver {
  const torch::nn::Module* seen = nullptr;
  at::Tensor at_input(const torch::nn::Module& layer, const at::Tensor& x) override {
    seen = &layer;
    return x * 2;
  }
};

TEST(ActivationQuant, LayerInputIsTheIdentityUntilAnObserverIsInstalledAndObserversNest) {
  torch::nn::Linear fc(3, 2);
  const auto x = torch::ones({1, 3});
  EXPECT_TRUE(quant::layer_input(*fc, x).is_same(x));
  Doubler outer, inner;
  {
    quant::ObserveActivations a(&outer);
    EXPECT_TRUE(torch::equal(quant::layer_input(*fc, x), x * 2));
    {
      quant::ObserveActivations b(&inner);
      quant::layer_input(*fc, x);
      EXPECT_EQ(inner.seen, fc.get());
    }
    quant::ObserveActivations none(nullptr);  // installs nothing: outer still observes
    outer.seen = nullptr;
    quant::layer_input(*fc, x);
    EXPECT_EQ(outer.seen, fc.get());
  }
  EXPECT_TRUE(quant::layer_input(*fc, x).is_same(x));
}

TrainConfig mlp_config(const std::string& dir, const std::string& name) {
  TrainConfig c = paratrain::testing::small_mlp_config(dir);
  c.run.name = name;
  c.run.seed = 9;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.train.eval_every_epochs = 1;
  return c;
}

TEST(ActivationQuant, CalibrationRecordsEachLayersInputRangeByName) {
  auto model = paratrain::train::make_model(mlp_config("/tmp", "x"));
  quant::RangeRecorder recorder;
  const auto x = torch::randn({8, 36});
  {
    quant::ObserveActivations observe(&recorder);
    model->forward(x);
    model->forward(x * 3);
  }
  const auto ranges = recorder.ranges(*model);
  ASSERT_EQ(ranges.size(), 3u);  // fc0, fc1, fc2
  EXPECT_FLOAT_EQ(ranges.at("fc0").min, (x * 3).min().item<float>());
  EXPECT_FLOAT_EQ(ranges.at("fc0").max, (x * 3).max().item<float>());
  EXPECT_GE(ranges.at("fc1").min, 0.0f);  // after a ReLU
}

// One process, 12 steps; its last checkpoint.
struct Trained {
  fs::path checkpoint;
  paratrain::train::TrainResult result;
};

Trained train_one(const TrainConfig& cfg) {
  Trained t;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    paratrain::train::Trainer trainer(cfg, g);
    t.result = trainer.fit();
  });
  t.checkpoint = t.result.last_checkpoint;
  return t;
}

TEST(ActivationQuant, AStaticFileRunsTheForwardItsRangesDescribe) {
  const auto dir = paratrain::testing::temp_dir("act_static");
  // Trained to well above chance (10 classes), so that accuracies compare.
  auto cfg = mlp_config(dir, "float");
  cfg.train.max_steps = 0;
  cfg.train.epochs = 10;
  const Trained run = train_one(cfg);
  ASSERT_GT(run.result.test.accuracy, 0.5);
  const auto file = fs::path(dir) / "static.int8.safetensors";
  paratrain::train::QuantizeOptions options;
  options.calibrate = 4;
  const auto report = paratrain::train::quantize_checkpoint(run.checkpoint, file, options);
  EXPECT_EQ(report.activations, "static");
  EXPECT_EQ(report.calibrated_batches, 4);
  const auto contents = paratrain::checkpoint::read_safetensors(file);
  EXPECT_EQ(contents.metadata.at("quant.activations"), "static");
  EXPECT_EQ(contents.metadata.at("quant.activation_bits"), "8");

  // The forward by hand: each layer's input fake-quantized on its range's
  // grid, the dequantized weights, ReLU between.
  const auto loaded = paratrain::train::load_trained_model(file);
  EXPECT_EQ(loaded.activations, "static");
  auto params = loaded.model->named_parameters();
  const auto x = torch::randn({5, 36});
  at::Tensor h = x;
  for (const std::string layer : {"fc0", "fc1", "fc2"}) {
    const at::Tensor r = contents.tensors.at("act_range/" + layer);
    const auto grid = quant::activation_grid({r[0].item<float>(), r[1].item<float>()}, 8);
    h = torch::nn::functional::linear(quant::fake_quantize_grid(h, grid), params[layer + ".weight"],
                                      params[layer + ".bias"]);
    if (layer != "fc2") h = torch::relu(h);
  }
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(loaded.model->forward(x), h));
  const auto eval = paratrain::train::evaluate_trained_model(loaded);
  std::cout << "[act] static int8 activations: accuracy " << eval.accuracy << " vs float " << run.result.test.accuracy
            << "\n";
  EXPECT_NEAR(eval.accuracy, run.result.test.accuracy, 0.05);

  // Dynamic, simulated: each input on the grid of its own range.
  {
    paratrain::train::QuantizeOptions o;
    o.activations = "dynamic";
    const auto out = fs::path(dir) / "dynamic_by_hand.safetensors";
    paratrain::train::quantize_checkpoint(run.checkpoint, out, o);
    paratrain::train::LoadOptions simulate;
    simulate.int8_kernels = false;
    const auto m = paratrain::train::load_trained_model(out, simulate);
    at::Tensor d = x;
    for (const std::string layer : {"fc0", "fc1", "fc2"}) {
      const auto grid = quant::activation_grid(quant::range_of(d), 8);
      d = torch::nn::functional::linear(quant::fake_quantize_grid(d, grid), params[layer + ".weight"],
                                        params[layer + ".bias"]);
      if (layer != "fc2") d = torch::relu(d);
    }
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(m.model->forward(x), d));
    EXPECT_FALSE(torch::equal(d, h)) << "dynamic and static grids gave the same forward";
  }

  // Dynamic (the default without --calibrate) and none load and run too.
  for (const std::string mode : {"dynamic", "none"}) {
    paratrain::train::QuantizeOptions o;
    o.activations = mode;
    const auto out = fs::path(dir) / (mode + ".int8.safetensors");
    paratrain::train::quantize_checkpoint(run.checkpoint, out, o);
    const auto m = paratrain::train::load_trained_model(out);
    EXPECT_EQ(m.activations, mode);
    const double accuracy = paratrain::train::evaluate_trained_model(m).accuracy;
    std::cout << "[act] " << mode << " activations: accuracy " << accuracy << "\n";
    EXPECT_NEAR(accuracy, run.result.test.accuracy, 0.05) << mode;
  }
  EXPECT_EQ(paratrain::train::quantize_checkpoint(run.checkpoint, fs::path(dir) / "d.safetensors").activations,
            "dynamic");

  // Bad requests and a damaged file are named.
  paratrain::train::QuantizeOptions bad;
  bad.activations = "static";  // no --calibrate
  EXPECT_THROW(paratrain::train::quantize_checkpoint(run.checkpoint, fs::path(dir) / "b.safetensors", bad),
               paratrain::ConfigError);
  bad.activations = "dynamic";
  bad.calibrate = 2;
  EXPECT_THROW(paratrain::train::quantize_checkpoint(run.checkpoint, fs::path(dir) / "b.safetensors", bad),
               paratrain::ConfigError);
  auto damaged = contents;
  damaged.tensors.erase("act_range/fc1");
  paratrain::checkpoint::write_safetensors(fs::path(dir) / "damaged.safetensors", damaged);
  try {
    paratrain::train::load_trained_model(fs::path(dir) / "damaged.safetensors");
    ADD_FAILURE() << "a static file without a layer's range loaded";
  } catch (const paratrain::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("act_range/fc1"), std::string::npos) << e.what();
  }
}

TEST(Int8Kernels, ALinearOnTheInt8KernelIsWithinTheQuantizationErrorOfTheFloatOne) {
  if (quant::int8_engine().empty()) GTEST_SKIP() << "this LibTorch has no quantized engine (Debian's ships oneDNN)";
  torch::manual_seed(3);
  auto net = torch::nn::Sequential(torch::nn::Linear(64, 32));
  auto& fc = *net->ptr(0)->as<torch::nn::Linear>();
  quant::Int8LinearKernels kernels(*net);
  EXPECT_EQ(kernels.engine(), quant::int8_engine());
  for (const auto& shape : {std::vector<int64_t>{16, 64}, std::vector<int64_t>{2, 8, 64}}) {
    const auto x = torch::randn(shape);
    torch::NoGradGuard no_grad;
    const auto exact = fc.forward(x);
    at::Tensor y;
    {
      quant::ObserveActivations observe(&kernels);
      y = quant::linear(fc, x);
    }
    ASSERT_EQ(y.sizes(), exact.sizes());
    // Each product term is off by at most |x| s_w / 2 + |w| s_x / 2 (plus the
    // product of the halves): bound the sum over the 64 inputs coarsely.
    // x86 kernels quantize inputs to 7 bits (Note [Int8 kernels]).
    const double levels = quant::int8_reduces_range() ? 127 : 255;
    const double s_w = fc.weight.abs().max().item<double>() / 127, s_x = (x.max() - x.min()).item<double>() / levels;
    const double bound = 64 * (x.abs().max().item<double>() * s_w / 2 + fc.weight.abs().max().item<double>() * s_x / 2 +
                               s_w * s_x / 4);
    const double error = (y - exact).abs().max().item<double>();
    EXPECT_LE(error, bound) << shape.size() << "-D input";
    EXPECT_GT(error, 0) << "the kernel returned the float result: was it used?";
  }
}

TEST(Int8Kernels, ADynamicFileEvaluatesOnTheKernelsCloseToSimulated) {
  const auto dir = paratrain::testing::temp_dir("int8_kernels");
  auto cfg = mlp_config(dir, "float");
  cfg.train.max_steps = 0;
  cfg.train.epochs = 10;
  const Trained run = train_one(cfg);
  const auto file = fs::path(dir) / "dynamic.int8.safetensors";
  paratrain::train::quantize_checkpoint(run.checkpoint, file);
  if (quant::int8_engine().empty()) GTEST_SKIP() << "this LibTorch has no quantized engine (Debian's ships oneDNN)";
  const auto on_kernels = paratrain::train::load_trained_model(file);
  EXPECT_EQ(on_kernels.kernels, "int8 Linear (" + quant::int8_engine() + ")");
  paratrain::train::LoadOptions simulate;
  simulate.int8_kernels = false;
  const auto simulated = paratrain::train::load_trained_model(file, simulate);
  EXPECT_EQ(simulated.kernels, "simulated");
  const double a = paratrain::train::evaluate_trained_model(on_kernels).accuracy;
  const double b = paratrain::train::evaluate_trained_model(simulated).accuracy;
  std::cout << "[int8 kernels] accuracy " << a << " on the kernels, " << b << " simulated, "
            << run.result.test.accuracy << " float\n";
  EXPECT_NEAR(a, b, 0.03);
  // 4-bit weights and per-tensor scales have no kernel here: simulated.
  paratrain::train::QuantizeOptions four;
  four.bits = 4;
  paratrain::train::quantize_checkpoint(run.checkpoint, fs::path(dir) / "w4.safetensors", four);
  EXPECT_EQ(paratrain::train::load_trained_model(fs::path(dir) / "w4.safetensors").kernels, "simulated");
  paratrain::train::QuantizeOptions per_tensor;
  per_tensor.granularity = quant::Granularity::kPerTensor;
  paratrain::train::quantize_checkpoint(run.checkpoint, fs::path(dir) / "t.safetensors", per_tensor);
  EXPECT_EQ(paratrain::train::load_trained_model(fs::path(dir) / "t.safetensors").kernels, "simulated");
}

using paratrain::testing::relative_diff;
using paratrain::testing::train_ranks;

TrainConfig qat_config(const std::string& dir, const std::string& name, int64_t activation_bits) {
  TrainConfig c = mlp_config(dir, name);
  c.train.eval_every_epochs = 0;
  c.quant.qat = true;
  c.quant.weight_bits = 8;
  c.quant.activation_bits = activation_bits;
  return c;
}

// Note [QAT and float order] (qat_test.cpp): one process and 2 ranks are
// compared over 3 steps, before float noise can move a value across a
// rounding boundary of the grid.
TEST(ActivationQat, TwoRanksEqualOneProcessAndTheActivationsAreQuantized) {
  const auto dir = paratrain::testing::temp_dir("act_qat");
  auto single = qat_config(dir, "single", 4);
  single.ddp.mode = "none";
  single.train.max_steps = 3;
  const Params oracle = train_ranks(single, 1);
  for (int64_t stage : {0, 2}) {
    auto cfg = qat_config(dir, "zero" + std::to_string(stage), 4);
    cfg.zero.stage = stage;
    cfg.train.max_steps = 3;
    const Params two = train_ranks(cfg, 2);
    const double diff = relative_diff(two, oracle);
    std::cout << "[act qat] zero.stage " << stage << ", 2 ranks vs one process, 3 steps: " << diff << "\n";
    EXPECT_LT(diff, 1e-5) << stage;
  }
  // The control: weight-only QAT trains elsewhere.
  auto weights_only = qat_config(dir, "weights_only", 0);
  weights_only.ddp.mode = "none";
  weights_only.train.max_steps = 3;
  EXPECT_GT(relative_diff(train_ranks(weights_only, 1), oracle), 1e-4);
}

TEST(ActivationQat, QuantizingTheRunKeepsItsLearnedRangesAndItsForward) {
  const auto dir = paratrain::testing::temp_dir("act_qat_file");
  auto cfg = qat_config(dir, "q", 8);
  cfg.ddp.mode = "none";
  cfg.train.eval_every_epochs = 1;
  cfg.train.max_steps = 0;
  cfg.train.epochs = 10;
  const Trained run = train_one(cfg);
  ASSERT_GT(run.result.test.accuracy, 0.5);
  const auto file = fs::path(dir) / "q.int8.safetensors";
  const auto report = paratrain::train::quantize_checkpoint(run.checkpoint, file);
  EXPECT_EQ(report.activations, "static");
  EXPECT_EQ(report.calibrated_batches, 0);  // learned, not measured
  const auto contents = paratrain::checkpoint::read_safetensors(file);
  const auto float_model = paratrain::train::load_trained_model(run.checkpoint);
  const auto* qat = dynamic_cast<const paratrain::train::FakeQuantModel*>(float_model.model.get());
  ASSERT_NE(qat, nullptr);
  for (const auto& [layer, range] : qat->activation_ranges()) {
    const at::Tensor r = contents.tensors.at("act_range/" + layer);
    EXPECT_EQ(r[0].item<float>(), range.min) << layer;
    EXPECT_EQ(r[1].item<float>(), range.max) << layer;
  }
  const auto loaded = paratrain::train::load_trained_model(file);
  EXPECT_EQ(loaded.activations, "static");
  EXPECT_EQ(loaded.activation_bits, 8);
  const auto eval = paratrain::train::evaluate_trained_model(loaded);
  EXPECT_NEAR(eval.accuracy, run.result.test.accuracy, 1.0 / 96 + 1e-12);  // one test item at most
  EXPECT_NEAR(eval.loss, run.result.test.loss, 1e-4);
  paratrain::train::QuantizeOptions calibrate;
  calibrate.calibrate = 2;
  EXPECT_THROW(paratrain::train::quantize_checkpoint(run.checkpoint, fs::path(dir) / "c.safetensors", calibrate),
               paratrain::ConfigError);
}

TEST(ActivationQat, ConfigNamesWhatActivationBitsNeed) {
  TrainConfig c = qat_config("/tmp", "x", 8);
  paratrain::train::validate_config(c);
  c.quant.qat = false;
  EXPECT_THROW(paratrain::train::validate_config(c), paratrain::ConfigError);
  c.quant.qat = true;
  c.ps.servers = 1;
  EXPECT_THROW(paratrain::train::validate_config(c), paratrain::ConfigError);
  c.ps.servers = 0;
  EXPECT_THROW(paratrain::train::apply_override(c, "quant.activation_bits=1"), paratrain::ConfigError);
}

}  // namespace

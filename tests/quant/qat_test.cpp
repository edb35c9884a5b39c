// Quantization-aware training (quant.qat): the wrapped forward equals the
// model with quantize-dequantized weights, gradients reach the registered
// parameters, QAT under DDP and FSDP at 2 ranks equals one process,
// quant.start_step trains in float first, and `paratrain quantize` of a QAT
// run holds the weights its forward used. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/quant/quantize.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/inference/trained_model.h"
#include "paratrain/train/qat/fake_quant_model.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/support/small_mlp.h"

namespace {

using paratrain::train::TrainConfig;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

// tests/support/small_mlp.h's run with momentum SGD (every gradient enters
// the weights linearly) and fake-quantized weights.
TrainConfig qat_config(const std::string& dir, const std::string& name, int64_t bits) {
  TrainConfig c = paratrain::testing::small_mlp_config(dir);
  c.run.name = name;
  c.run.seed = 9;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.zero.unit_min_params = 200;
  c.quant.qat = true;
  c.quant.weight_bits = bits;
  return c;
}

Params train(const TrainConfig& cfg, int world) {
  Params out;
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    paratrain::train::Trainer t(cfg, g);
    t.fit();
    auto p = t.full_parameters();
    if (g.rank() == 0) out = std::move(p);
  });
  return out;
}

double relative_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

TEST(Qat, TheForwardIsTheModelWithQuantizeDequantizedWeightsAndGradientsReachTheParameters) {
  auto dir = paratrain::testing::temp_dir("qat_forward");
  const auto cfg = qat_config(dir, "f", 4);
  auto wrapped = paratrain::train::seeded_model_factory(cfg, c10::Device(c10::kCPU))();
  auto plain_cfg = cfg;
  plain_cfg.quant.qat = false;
  auto plain = paratrain::train::seeded_model_factory(plain_cfg, c10::Device(c10::kCPU))();
  ASSERT_NE(dynamic_cast<paratrain::train::FakeQuantModel*>(wrapped.get()), nullptr);
  // The same names and values as the plain model: checkpoints read alike.
  const auto a = wrapped->named_parameters(), b = plain->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : b) EXPECT_TRUE(torch::equal(a[item.key()], item.value())) << item.key();
  const at::Tensor original = a["fc0.weight"].detach().clone();
  {
    torch::NoGradGuard no_grad;
    for (auto& item : plain->named_parameters()) {
      if (item.key().find("weight") == std::string::npos) continue;
      item.value().copy_(paratrain::quant::dequantize(paratrain::quant::quantize_symmetric(item.value(), 4)));
    }
  }
  const at::Tensor x = torch::randn({5, 36});
  const at::Tensor y = wrapped->forward(x);
  EXPECT_TRUE(torch::allclose(y, plain->forward(x), 1e-6, 1e-6));
  // The weights are back to float after the forward; the gradient reaches them.
  EXPECT_TRUE(torch::equal(wrapped->named_parameters()["fc0.weight"], original));
  y.sum().backward();
  EXPECT_TRUE(wrapped->named_parameters()["fc0.weight"].grad().defined());
  // Switched off: the float model.
  static_cast<paratrain::train::FakeQuantModel&>(*wrapped).set_active(false);
  auto float_cfg = plain_cfg;
  auto fresh = paratrain::train::seeded_model_factory(float_cfg, c10::Device(c10::kCPU))();
  EXPECT_TRUE(torch::allclose(wrapped->forward(x), fresh->forward(x), 0, 0));
}

// Note [QAT and float order]: rounding is discontinuous, so once a weight
// sits within float noise of a rounding boundary, runs that sum in another
// order (one process against two ranks) part by a whole quantization step:
// measured here at 12 steps, 3.3e-3 relative at 4 bits, the same for every
// 2-rank layout. So the layouts are compared with one process over 3 steps
// (before any weight can come near a boundary by float noise alone) and with
// each other over 12 (they reduce in the same order).
TEST(Qat, DdpFsdpAndParameterServersEqualOneProcessAndStartStepTrainsInFloatFirst) {
  auto dir = paratrain::testing::temp_dir("qat_oracle");
  auto short_single = qat_config(dir, "short_single", 4);
  short_single.ddp.mode = "none";
  short_single.train.max_steps = 3;
  const Params short_oracle = train(short_single, 1);
  Params ddp12;
  for (int64_t stage : {0, 3}) {
    auto cfg = qat_config(dir, "zero" + std::to_string(stage), 4);
    cfg.zero.stage = stage;
    cfg.train.max_steps = 3;
    const double diff = relative_diff(train(cfg, 2), short_oracle);
    std::cout << "[qat] zero.stage " << stage << " at 2 ranks vs one process, 3 steps: relative diff " << diff << "\n";
    EXPECT_LT(diff, 1e-5) << stage;
    cfg.run.name += "_12";
    cfg.train.max_steps = 12;
    const Params twelve = train(cfg, 2);
    if (stage == 0) ddp12 = twelve;
    else EXPECT_LT(relative_diff(twelve, ddp12), 1e-6) << "FSDP against DDP, 12 steps";
  }
  auto ps = qat_config(dir, "ps", 4);
  ps.ps.servers = 1;
  EXPECT_LT(relative_diff(train(ps, 3), ddp12), 1e-6) << "parameter servers against DDP, 12 steps";
  auto single = qat_config(dir, "single", 4);
  single.ddp.mode = "none";
  const Params oracle = train(single, 1);
  // The control: without fake quantization the run ends elsewhere.
  auto plain = qat_config(dir, "plain", 4);
  plain.ddp.mode = "none";
  plain.quant.qat = false;
  const Params float_run = train(plain, 1);
  EXPECT_GT(relative_diff(float_run, oracle), 1e-3);
  // quant.start_step past the last step: float training all along.
  auto late = qat_config(dir, "late", 4);
  late.ddp.mode = "none";
  late.quant.start_step = 100;
  EXPECT_LT(relative_diff(train(late, 1), float_run), 1e-12);
  // Starting at step 6: the first 6 steps are float, then it parts.
  auto mid = qat_config(dir, "mid", 4);
  mid.ddp.mode = "none";
  mid.quant.start_step = 6;
  const double mid_diff = relative_diff(train(mid, 1), float_run);
  EXPECT_GT(mid_diff, 0.0);
  EXPECT_LT(mid_diff, relative_diff(oracle, float_run));
}

// The int8 file of a QAT run holds exactly the weights the QAT forward used
// (the same per-channel max scales), so its evaluation is the run's.
TEST(Qat, QuantizingAQatRunKeepsItsBitsAndItsForward) {
  auto dir = paratrain::testing::temp_dir("qat_quantize");
  auto cfg = qat_config(dir, "q", 4);
  cfg.ddp.mode = "none";
  cfg.train.eval_every_epochs = 1;
  cfg.train.max_steps = 20;
  paratrain::train::TrainResult result;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    paratrain::train::Trainer t(cfg, g);
    result = t.fit();
  });
  const auto file = std::filesystem::path(dir) / "q.int4.safetensors";
  const auto report = paratrain::train::quantize_checkpoint(result.last_checkpoint, file);
  EXPECT_EQ(report.bits, 4);  // the run's quant.weight_bits
  const auto int4 = paratrain::train::load_trained_model(file);
  EXPECT_EQ(int4.bits, 4);
  const auto eval = paratrain::train::evaluate_trained_model(int4);
  EXPECT_NEAR(eval.accuracy, result.test.accuracy, 1.0 / 96 + 1e-12);  // one test item at most
  EXPECT_NEAR(eval.loss, result.test.loss, 1e-4);
}

}  // namespace

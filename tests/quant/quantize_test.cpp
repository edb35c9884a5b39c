// Symmetric quantization (paratrain/quant/quantize.h): the round trip stays
// within half a step of each channel's scale, per-channel scales beat one
// per tensor on a weight with one large row, a quantized Linear equals the
// float one within the bound its scales imply, and fake quantization's
// forward is quantize-dequantize while its gradient passes straight through
// inside the range and is zero outside.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/quant/quantize.h"

namespace {

using paratrain::quant::dequantize;
using paratrain::quant::fake_quantize;
using paratrain::quant::Granularity;
using paratrain::quant::max_level;
using paratrain::quant::quantize_symmetric;

TEST(Quantize, RoundTripStaysWithinHalfAStepOfEachChannelsScale) {
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({16, 3, 3, 3});  // a Conv's weight: 16 output channels
  for (int bits : {8, 4, 2}) {
    for (auto g : {Granularity::kPerChannel, Granularity::kPerTensor}) {
      const auto q = quantize_symmetric(w, bits, g);
      EXPECT_EQ(q.values.scalar_type(), at::kChar);
      EXPECT_EQ(q.values.sizes(), w.sizes());
      EXPECT_EQ(q.scales.numel(), g == Granularity::kPerChannel ? 16 : 1);
      EXPECT_LE(q.values.abs().max().item<int>(), max_level(bits));
      const at::Tensor err = (dequantize(q) - w).abs();
      const at::Tensor half_step =
          (g == Granularity::kPerChannel ? q.scales.reshape({16, 1, 1, 1}) : q.scales.reshape({})) / 2;
      EXPECT_TRUE((err <= half_step * (1 + 1e-6)).all().item<bool>()) << bits << " bits";
      // The largest element of each slice is exact (up to float rounding).
      EXPECT_LT(err.max().item<double>(), half_step.max().item<double>() * (1 + 1e-6));
    }
  }
  EXPECT_EQ(max_level(8), 127);
  EXPECT_EQ(max_level(4), 7);
  EXPECT_THROW(quantize_symmetric(w, 9), c10::Error);
  EXPECT_THROW(quantize_symmetric(w.to(at::kLong), 8), c10::Error);
}

TEST(Quantize, PerChannelBeatsPerTensorOnAWeightWithOneLargeRow) {
  torch::manual_seed(1);
  at::Tensor w = torch::randn({8, 64}) * 0.05;
  w[3] *= 100;  // one output channel 100x larger: it sets the per-tensor step
  // The other rows' error: per tensor they share the large row's step.
  const at::Tensor others = torch::cat({torch::arange(0, 3), torch::arange(4, 8)});
  auto error_of_others = [&](Granularity g) {
    return (dequantize(quantize_symmetric(w, 8, g)) - w).index_select(0, others).abs().mean().item<double>();
  };
  const double per_channel = error_of_others(Granularity::kPerChannel);
  const double per_tensor = error_of_others(Granularity::kPerTensor);
  EXPECT_LT(per_channel * 10, per_tensor);
  // An all-zero channel comes back as zeros.
  w[5].zero_();
  EXPECT_TRUE(dequantize(quantize_symmetric(w)).select(0, 5).eq(0).all().item<bool>());
}

// y = x W^T + b with W quantized: |y - y_q| <= sum_k |x_k| * s_row / 2 for
// each output, the bound the row's scale implies.
TEST(Quantize, AQuantizedLinearEqualsTheFloatOneWithinTheScalesBound) {
  torch::manual_seed(2);
  torch::nn::Linear fc(32, 10);
  const at::Tensor x = torch::randn({5, 32});
  torch::NoGradGuard no_grad;
  const auto q = quantize_symmetric(fc->weight);
  const at::Tensor exact = fc->forward(x);
  const at::Tensor approx = torch::nn::functional::linear(x, dequantize(q), fc->bias);
  const at::Tensor bound = x.abs().sum(1, /*keepdim=*/true) * (q.scales.reshape({1, 10}) / 2);
  EXPECT_TRUE(((exact - approx).abs() <= bound * (1 + 1e-5) + 1e-6).all().item<bool>());
  EXPECT_GT((exact - approx).abs().max().item<double>(), 0.0);  // it did quantize
}

TEST(FakeQuantize, ForwardIsQuantizeDequantizeAndTheGradientPassesStraightThroughInsideTheRange) {
  torch::manual_seed(3);
  const at::Tensor w = torch::randn({4, 6});
  const auto q = quantize_symmetric(w, 4);
  at::Tensor x = w.clone().requires_grad_(true);
  const at::Tensor y = fake_quantize(x, q.scales, 4);
  EXPECT_TRUE(torch::allclose(y, dequantize(q), 0, 1e-7));
  // Inputs beyond the range are clamped: their gradient is zero.
  at::Tensor wide = (w * 2).requires_grad_(true);  // half of every row beyond max|row| * 1
  const at::Tensor limit = q.scales.reshape({4, 1}) * max_level(4);
  fake_quantize(wide, q.scales, 4).sum().backward();
  const at::Tensor inside = (wide.detach().abs() <= limit).to(at::kFloat);
  EXPECT_TRUE(torch::equal(wide.grad(), inside));
  EXPECT_GT(inside.sum().item<double>(), 0);
  EXPECT_LT(inside.sum().item<double>(), static_cast<double>(inside.numel()));
  y.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::ones_like(w)));  // all inside: straight through
  // One scale for the whole tensor too.
  const auto per_tensor = quantize_symmetric(w, 8, Granularity::kPerTensor);
  EXPECT_TRUE(torch::allclose(fake_quantize(w, per_tensor.scales, 8), dequantize(per_tensor), 0, 1e-7));
}

}  // namespace

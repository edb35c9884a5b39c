// optim::clip_grad_norm (optim/clip.h): the same gradients, bit for bit, and
// the same norm as torch::nn::utils::clip_grad_norm_, returned as a tensor
// (no device sync: Note [Clipping without a sync]); and the coefficient's
// edge cases (not binding, a parameter without a gradient, one parameter, a
// NaN gradient).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "paratrain/optim/clip.h"

namespace paratrain::optim {
namespace {

// Parameters with gradients scaled by `scale` (large: the clipping binds);
// parameter `without` (if >= 0) gets none.
std::vector<at::Tensor> params_with_grads(double scale, int without = -1, int count = 4) {
  torch::manual_seed(7);
  std::vector<at::Tensor> out;
  const std::vector<std::vector<int64_t>> shapes{{7, 5}, {5}, {3, 4, 2}, {11}};
  for (int i = 0; i < count; ++i) {
    auto p = torch::randn(shapes[i]).requires_grad_(true);
    if (i != without) p.mutable_grad() = torch::randn(shapes[i]) * scale;
    out.push_back(p);
  }
  return out;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  auto x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void expect_as_libtorch(double scale, double max_norm, int without = -1, int count = 4) {
  auto reference = params_with_grads(scale, without, count);
  auto ours = params_with_grads(scale, without, count);
  const double expected = torch::nn::utils::clip_grad_norm_(reference, max_norm);
  const at::Tensor norm = clip_grad_norm(ours, max_norm);
  ASSERT_TRUE(norm.defined());
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_EQ(norm.item<double>(), expected);
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_TRUE(same_bits(ours[i].grad(), reference[i].grad())) << "parameter " << i << ", scale " << scale;
}

TEST(ClipGradNorm, BindingEqualsLibTorchsBitwise) { expect_as_libtorch(10.0, 1.0); }

TEST(ClipGradNorm, NotBindingLeavesTheGradientsAsLibTorchDoes) { expect_as_libtorch(1e-3, 1.0); }

TEST(ClipGradNorm, SkipsAParameterWithoutAGradient) { expect_as_libtorch(10.0, 0.5, /*without=*/1); }

TEST(ClipGradNorm, OneParameter) { expect_as_libtorch(10.0, 0.5, -1, /*count=*/1); }

TEST(ClipGradNorm, NoGradientIsAnUndefinedNorm) {
  auto params = params_with_grads(1.0, -1, 1);
  params[0].mutable_grad() = at::Tensor();
  EXPECT_FALSE(clip_grad_norm(params, 1.0).defined());
}

TEST(ClipGradNorm, ANanGradientSpreadsAsInLibTorch) {
  auto reference = params_with_grads(1.0);
  auto ours = params_with_grads(1.0);
  reference[2].mutable_grad()[0][0][0] = NAN;
  ours[2].mutable_grad()[0][0][0] = NAN;
  const double expected = torch::nn::utils::clip_grad_norm_(reference, 1.0);
  EXPECT_TRUE(std::isnan(expected));
  EXPECT_TRUE(std::isnan(clip_grad_norm(ours, 1.0).item<double>()));
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_TRUE(same_bits(ours[i].grad(), reference[i].grad())) << "parameter " << i;
}

TEST(ClipCoefficient, ScalesCpuGradientsOnlyBelowOne) {
  auto g = torch::full({3}, 2.0f);
  scale_by_coefficient({g}, clip_coefficient(torch::tensor(0.5), 1.0));  // coefficient clamped to 1
  EXPECT_TRUE(torch::equal(g, torch::full({3}, 2.0f)));
  scale_by_coefficient({g}, clip_coefficient(torch::tensor(4.0), 1.0));
  EXPECT_NEAR(g[0].item<float>(), 2.0f / (4.0f + 1e-6f), 1e-7);
}

}  // namespace
}  // namespace paratrain::optim

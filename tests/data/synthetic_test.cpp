// Synthetic datasets: determinism from seeds, shapes, that labels come from
// one fixed teacher (a model fit on one seed generalizes to another), that
// regression targets are exactly linear, and that the global RNG is untouched.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/data/synthetic.h"

namespace paratrain::data {
namespace {

SyntheticOptions classification(int64_t n, uint64_t seed) {
  SyntheticOptions o;
  o.num_samples = n;
  o.input_shape = {16};
  o.num_classes = 4;
  o.seed = seed;
  return o;
}

TEST(Synthetic, SameSeedSameData) {
  const TensorDataset a = make_synthetic(classification(300, 7));
  const TensorDataset b = make_synthetic(classification(300, 7));
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_TRUE(a.targets.equal(b.targets));
  const TensorDataset c = make_synthetic(classification(300, 8));
  EXPECT_FALSE(a.inputs.equal(c.inputs));
}

TEST(Synthetic, TeacherSeedChangesLabelsNotInputs) {
  SyntheticOptions o = classification(300, 7);
  const TensorDataset a = make_synthetic(o);
  o.teacher_seed += 1;
  const TensorDataset b = make_synthetic(o);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_FALSE(a.targets.equal(b.targets));
}

TEST(Synthetic, FlatAndImageShapes) {
  const TensorDataset flat = make_synthetic(classification(2000, 1));
  EXPECT_EQ(flat.inputs.sizes(), at::IntArrayRef({2000, 16}));
  EXPECT_EQ(flat.inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(flat.targets.sizes(), at::IntArrayRef({2000}));
  EXPECT_EQ(flat.targets.scalar_type(), at::kLong);
  // Every class appears, none dominates (a degenerate teacher would).
  const at::Tensor counts = flat.targets.bincount({}, 4);
  EXPECT_GT(counts.min().item<int64_t>(), 2000 / 4 / 4) << counts;
  EXPECT_NEAR(flat.inputs.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(flat.inputs.std().item<double>(), 1.0, 0.02);

  SyntheticOptions img;
  img.num_samples = 10;
  img.input_shape = {3, 8, 8};
  img.num_classes = 10;
  const TensorDataset images = make_synthetic(img);
  EXPECT_EQ(images.inputs.sizes(), at::IntArrayRef({10, 3, 8, 8}));
  EXPECT_GE(images.targets.min().item<int64_t>(), 0);
  EXPECT_LT(images.targets.max().item<int64_t>(), 10);
}

TEST(Synthetic, RegressionTargetsAreAnAffineFunctionOfInputs) {
  SyntheticOptions o;
  o.num_samples = 200;
  o.input_shape = {2, 3};
  o.num_classes = 3;
  o.task = SyntheticTask::kRegression;
  const TensorDataset ds = make_synthetic(o);
  ASSERT_EQ(ds.targets.sizes(), at::IntArrayRef({200, 3}));
  ASSERT_EQ(ds.targets.scalar_type(), at::kFloat);
  // Least squares on [x, 1] recovers the targets up to float rounding.
  const at::Tensor x = torch::cat({ds.inputs.reshape({200, 6}), torch::ones({200, 1})}, 1).to(torch::kDouble);
  const at::Tensor y = ds.targets.to(torch::kDouble);
  const at::Tensor w = std::get<0>(torch::linalg_lstsq(x, y));
  EXPECT_LT((x.matmul(w) - y).abs().max().item<double>(), 1e-5);

  o.noise_std = 0.5;
  const TensorDataset noisy = make_synthetic(o);
  const at::Tensor residual = noisy.targets.to(torch::kDouble) - x.matmul(w);
  EXPECT_NEAR(residual.std().item<double>(), 0.5, 0.05);
}

TEST(Synthetic, DoesNotTouchTheGlobalGenerator) {
  torch::manual_seed(5);
  const at::Tensor expected = torch::randn({4});
  torch::manual_seed(5);
  make_synthetic(classification(100, 3));
  EXPECT_TRUE(torch::randn({4}).equal(expected));
}

// The point of a teacher: labels are a learnable function. Softmax
// regression fit on seed 1 must classify seed 2 (same teacher) far above
// chance (25%); with labels unrelated to inputs it could not.
TEST(Synthetic, ClassifierLearnsTeacherAndGeneralizesAcrossSeeds) {
  torch::manual_seed(0);
  const TensorDataset train = make_synthetic(classification(2000, 1));
  const TensorDataset test = make_synthetic(classification(1000, 2));
  torch::nn::Linear model(16, 4);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.05));
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model(train.inputs), train.targets).backward();
    opt.step();
  }
  torch::NoGradGuard no_grad;
  const double accuracy = model(test.inputs).argmax(1).eq(test.targets).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.9);
}

}  // namespace
}  // namespace paratrain::data

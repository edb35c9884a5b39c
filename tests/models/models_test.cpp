// Tests of the MLP and CNN: shapes, parameter names and counts (against
// counts worked out by hand), determinism under the seed, and that a few SGD
// steps on a fixed batch reduce the loss.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/models/cnn.h"
#include "paratrain/models/mlp.h"

namespace pm = paratrain::models;

namespace {

int64_t count_parameters(pm::Model& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

std::vector<std::string> parameter_names(pm::Model& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  return names;
}

// Runs `steps` of momentum SGD on a fixed batch; returns the losses.
std::vector<double> train_fixed_batch(pm::Model& m, const at::Tensor& x, const at::Tensor& y,
                                      int steps, double lr) {
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(m.forward(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace

TEST(Mlp, OutputShapeAcceptsImagesAndFlatInput) {
  torch::manual_seed(0);
  auto m = pm::make_mlp({});
  EXPECT_EQ(m->forward(torch::randn({5, 1, 28, 28})).sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(m->forward(torch::randn({3, 784})).sizes(), (std::vector<int64_t>{3, 10}));
  EXPECT_THROW(m->forward(torch::randn({3, 783})), c10::Error);
}

TEST(Mlp, ParameterNamesAndCount) {
  auto m = pm::make_mlp({.in_features = 784, .hidden = {256, 128}, .out_features = 10});
  EXPECT_EQ(parameter_names(*m),
            (std::vector<std::string>{"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias",
                                      "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(count_parameters(*m), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  auto d = pm::make_mlp({});  // default 784-1024-1024-10
  EXPECT_EQ(count_parameters(*d), 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10);
  auto linear = pm::make_mlp({.in_features = 4, .hidden = {}, .out_features = 3});
  EXPECT_EQ(count_parameters(*linear), 4 * 3 + 3);
  EXPECT_THROW(pm::make_mlp({.in_features = 4, .hidden = {0}, .out_features = 3}), c10::Error);
}

TEST(Mlp, ForwardMatchesHandWrittenMath) {
  torch::manual_seed(1);
  auto m = pm::make_mlp({.in_features = 6, .hidden = {5}, .out_features = 3});
  auto x = torch::randn({4, 6});
  auto p = m->named_parameters();
  auto h = torch::relu(x.matmul(p["fc0.weight"].t()) + p["fc0.bias"]);
  auto expected = h.matmul(p["fc1.weight"].t()) + p["fc1.bias"];
  EXPECT_TRUE(torch::allclose(m->forward(x), expected, 1e-6, 1e-6));
}

TEST(Cnn, OutputShapeParameterNamesAndCount) {
  torch::manual_seed(0);
  auto m = pm::make_cnn({});
  EXPECT_EQ(m->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(m->forward(torch::randn({2, 784})).sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(parameter_names(*m),
            (std::vector<std::string>{"conv0.weight", "conv0.bias", "conv1.weight", "conv1.bias",
                                      "fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"}));
  // 28 -> pool -> 14 -> pool -> 7, so fc0 sees 64*7*7 features.
  const int64_t expected = (1 * 32 * 9 + 32) + (32 * 64 * 9 + 64) + (64 * 7 * 7 * 128 + 128) +
                           (128 * 10 + 10);
  EXPECT_EQ(count_parameters(*m), expected);
  // Odd sizes floor at each pooling: 3 channels, 9 -> 4 -> 2.
  auto odd = pm::make_cnn({.in_channels = 3, .image_size = 9, .num_classes = 4,
                           .channels = {8, 16}, .hidden = 12});
  EXPECT_EQ(odd->forward(torch::randn({2, 3, 9, 9})).sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(odd->named_parameters()["fc0.weight"].sizes(), (std::vector<int64_t>{12, 16 * 2 * 2}));
  EXPECT_THROW(pm::make_cnn({.image_size = 3}), c10::Error);
}

TEST(Models, InitialisationIsDeterministicUnderTheSeed) {
  auto same = [](std::shared_ptr<pm::Model> a, std::shared_ptr<pm::Model> b) {
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      if (!torch::equal(pa[i], pb[i])) return false;
    return true;
  };
  torch::manual_seed(42);
  auto a = pm::make_mlp({});
  auto ac = pm::make_cnn({});
  torch::manual_seed(42);
  auto b = pm::make_mlp({});
  auto bc = pm::make_cnn({});
  torch::manual_seed(43);
  auto c = pm::make_mlp({});
  EXPECT_TRUE(same(a, b));
  EXPECT_TRUE(same(ac, bc));
  EXPECT_FALSE(same(a, c));
}

TEST(Models, SgdStepsReduceLossOnAFixedBatch) {
  torch::manual_seed(7);
  // Each class is a fixed random image plus noise: learnable in a few steps by
  // both models, so a wrong gradient path (or none) shows as a flat loss.
  auto prototypes = torch::randn({10, 1, 28, 28});
  auto y = torch::randint(0, 10, {32});
  auto x = prototypes.index_select(0, y) + 0.5 * torch::randn({32, 1, 28, 28});
  for (auto model : {pm::make_mlp({.hidden = {64}}), pm::make_cnn({.channels = {8, 8}, .hidden = 32})}) {
    auto losses = train_fixed_batch(*model, x, y, 30, 0.02);
    EXPECT_LT(losses.back(), 0.5 * losses.front())
        << model->name() << ": " << losses.front() << " -> " << losses.back();
  }
}

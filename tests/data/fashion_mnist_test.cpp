// Fashion-MNIST loader: small fake splits written byte by byte (pixel
// scaling, normalization, file discovery, every error), then the real files
// of dataset-fashion-mnist when installed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "expect_error.h"
#include "idx_files.h"
#include "paratrain/core/error.h"
#include "paratrain/data/fashion_mnist.h"
#include "tests/support/multi_rank.h"

namespace paratrain::data {
namespace {

using testing::Bytes;
using testing::expect_error;
using testing::idx_file;
using testing::write_gz;
using testing::write_plain;

Bytes pixels(int n, int rows = 28, int cols = 28) {
  Bytes out(static_cast<size_t>(n) * rows * cols);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>((i * 37 + i / 7) % 256);
  return out;
}

// A directory with a fake split: `n_images` images and `labels`.
std::string fake_split(const std::string& prefix, int n_images, const Bytes& labels, bool gz = true,
                       int rows = 28) {
  const std::string dir = paratrain::testing::temp_dir("paratrain-fmnist");
  const std::string ext = gz ? ".gz" : "";
  auto write = gz ? write_gz : write_plain;
  write(dir + "/" + prefix + "-images-idx3-ubyte" + ext,
        idx_file(0x08, {uint32_t(n_images), uint32_t(rows), 28}, pixels(n_images, rows)));
  write(dir + "/" + prefix + "-labels-idx1-ubyte" + ext,
        idx_file(0x08, {uint32_t(labels.size())}, labels));
  return dir;
}

TEST(FashionMnist, FakeTrainSplitIsScaledAndNormalized) {
  const std::string dir = fake_split("train", 3, {9, 0, 3});
  const TensorDataset ds = load_fashion_mnist(dir, Split::kTrain);
  ASSERT_EQ(ds.size(), 3);
  ASSERT_EQ(ds.inputs.sizes(), at::IntArrayRef({3, 1, 28, 28}));
  ASSERT_EQ(ds.inputs.scalar_type(), at::kFloat);
  ASSERT_EQ(ds.targets.scalar_type(), at::kLong);
  EXPECT_TRUE(ds.targets.equal(torch::tensor({9, 0, 3}, torch::kLong)));

  const Bytes raw = pixels(3);
  const at::Tensor flat = ds.inputs.reshape({-1}).contiguous();
  const float* got = flat.data_ptr<float>();
  for (size_t i = 0; i < raw.size(); ++i) {
    const double want = (raw[i] / 255.0 - 0.2860) / 0.3530;
    ASSERT_NEAR(got[i], want, 1e-5) << "pixel " << i;
  }

  FashionMnistOptions plain;
  plain.dir = dir;
  plain.normalize = false;
  const TensorDataset unscaled = load_fashion_mnist(plain);
  EXPECT_NEAR(unscaled.inputs.reshape({-1})[5].item<float>(), raw[5] / 255.0, 1e-7);
  EXPECT_GE(unscaled.inputs.min().item<float>(), 0.0f);
  EXPECT_LE(unscaled.inputs.max().item<float>(), 1.0f);
}

TEST(FashionMnist, TestSplitAndUncompressedNames) {
  const std::string dir = fake_split("t10k", 2, {4, 7}, /*gz=*/false);
  const TensorDataset ds = load_fashion_mnist(dir, Split::kTest);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_TRUE(ds.targets.equal(torch::tensor({4, 7}, torch::kLong)));
  // This directory has no train files.
  expect_error<DataError>([&] { load_fashion_mnist(dir, Split::kTrain); },
                          {dir + "/train-images-idx3-ubyte.gz", "does not exist",
                           "apt-get install dataset-fashion-mnist", "data.dir"});
}

TEST(FashionMnist, CountMismatchNamesBothFiles) {
  const std::string dir = fake_split("train", 3, {1, 2});
  expect_error<DataError>([&] { load_fashion_mnist(dir, Split::kTrain); },
                          {"count mismatch", dir + "/train-images-idx3-ubyte.gz", "3 images",
                           dir + "/train-labels-idx1-ubyte.gz", "2 labels"});
}

TEST(FashionMnist, MissingDirectoryGivesInstallHint) {
  expect_error<DataError>([] { load_fashion_mnist("/nonexistent/fashion", Split::kTrain); },
                          {"/nonexistent/fashion", "does not exist",
                           "apt-get install dataset-fashion-mnist", "data.dir"});
}

TEST(FashionMnist, MissingLabelsFileIsNamed) {
  const std::string dir = fake_split("train", 2, {1, 2});
  std::filesystem::remove(dir + "/train-labels-idx1-ubyte.gz");
  expect_error<DataError>([&] { load_fashion_mnist(dir, Split::kTrain); },
                          {dir + "/train-labels-idx1-ubyte.gz", "does not exist"});
}

TEST(FashionMnist, SwappedFilesAreCaughtByMagic) {
  const std::string dir = fake_split("train", 2, {1, 2});
  const std::string images = dir + "/train-images-idx3-ubyte.gz";
  const std::string labels = dir + "/train-labels-idx1-ubyte.gz";
  std::filesystem::rename(images, dir + "/tmp.gz");
  std::filesystem::rename(labels, images);
  std::filesystem::rename(dir + "/tmp.gz", labels);
  expect_error<DataError>([&] { load_fashion_mnist(dir, Split::kTrain); },
                          {images, "0x00000801", "expected 0x00000803"});
}

TEST(FashionMnist, WrongImageSizeAndBadLabelsAreRejected) {
  const std::string small = fake_split("train", 2, {1, 2}, true, /*rows=*/27);
  expect_error<DataError>([&] { load_fashion_mnist(small, Split::kTrain); },
                          {small + "/train-images-idx3-ubyte.gz", "27x28", "expected 28x28"});
  const std::string bad = fake_split("train", 2, {1, 10});
  expect_error<DataError>([&] { load_fashion_mnist(bad, Split::kTrain); },
                          {bad + "/train-labels-idx1-ubyte.gz", "up to 10", "0..9"});
}

TEST(FashionMnist, TruncatedImagesFileIsNamed) {
  const std::string dir = fake_split("train", 2, {1, 2});
  Bytes body = pixels(2);
  body.erase(body.end() - 100, body.end());
  write_gz(dir + "/train-images-idx3-ubyte.gz", idx_file(0x08, {2, 28, 28}, body));
  expect_error<DataError>([&] { load_fashion_mnist(dir, Split::kTrain); },
                          {dir + "/train-images-idx3-ubyte.gz", "truncated", "needs 1568 bytes",
                           "found 1468"});
}

bool real_dataset_installed() {
  return std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
}

// Reference facts below come from reading the files with Python/numpy:
// 6000 train / 1000 test items per class, first labels 9 (ankle boot),
// first training image's pixels sum to 76247, pixel mean 0.28604, std 0.35302.
TEST(FashionMnist, RealTrainSplit) {
  if (!real_dataset_installed()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  FashionMnistOptions options;
  options.normalize = false;
  const TensorDataset raw = load_fashion_mnist(options);
  ASSERT_EQ(raw.size(), 60000);
  ASSERT_EQ(raw.inputs.sizes(), at::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(raw.targets[0].item<int64_t>(), 9);
  EXPECT_STREQ(kFashionMnistClassNames[9], "Ankle boot");
  EXPECT_TRUE(raw.targets.bincount().equal(torch::full({10}, 6000, torch::kLong)));
  EXPECT_NEAR(raw.inputs[0].sum().item<double>() * 255.0, 76247.0, 0.5);
  EXPECT_NEAR(raw.inputs.mean().item<double>(), kFashionMnistMean, 1e-3);
  EXPECT_NEAR(raw.inputs.std().item<double>(), kFashionMnistStd, 1e-3);

  const TensorDataset ds = load_fashion_mnist();
  EXPECT_NEAR(ds.inputs.mean().item<double>(), 0.0, 2e-3);
  EXPECT_NEAR(ds.inputs.std().item<double>(), 1.0, 2e-3);
}

TEST(FashionMnist, RealTestSplit) {
  if (!real_dataset_installed()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const TensorDataset ds = load_fashion_mnist(kFashionMnistDir, Split::kTest);
  ASSERT_EQ(ds.size(), 10000);
  ASSERT_EQ(ds.inputs.sizes(), at::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(ds.targets[0].item<int64_t>(), 9);
  EXPECT_GE(ds.targets.min().item<int64_t>(), 0);
  EXPECT_LE(ds.targets.max().item<int64_t>(), 9);
  EXPECT_TRUE(ds.targets.bincount().equal(torch::full({10}, 1000, torch::kLong)));
}

}  // namespace
}  // namespace paratrain::data

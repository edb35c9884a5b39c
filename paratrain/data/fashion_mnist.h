// Fashion-MNIST (Xiao et al. 2017, arXiv 1708.07747) from the IDX files of
// Debian's dataset-fashion-mnist package: 28x28 grey images, 10 classes.
// Loads a whole split into memory; batching is the Loader's job.
#pragma once

#include <array>
#include <string>

#include "paratrain/data/dataset.h"

namespace paratrain::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Per-pixel mean and standard deviation of the training images scaled to
// [0, 1]; the usual normalization constants for this dataset.
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
inline constexpr int64_t kFashionMnistClasses = 10;
inline constexpr std::array<const char*, 10> kFashionMnistClassNames = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

enum class Split { kTrain, kTest };

struct FashionMnistOptions {
  // Directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (the
  // uncompressed names without .gz are accepted too). The train config's
  // `data.dir` lands here.
  std::string dir = kFashionMnistDir;
  Split split = Split::kTrain;
  // true: (x/255 - mean) / std, what models train on. false: x/255 in [0, 1],
  // for looking at images or computing other statistics.
  bool normalize = true;
};

// inputs: float32 [N, 1, 28, 28]; targets: int64 [N] in 0..9.
// N = 60000 (train) or 10000 (test) for the real files.
// Throws DataError naming the file on a missing directory or file (with how
// to install the dataset), a corrupt or truncated file, images/labels count
// mismatch, images that are not 28x28, or a label outside 0..9.
TensorDataset load_fashion_mnist(const FashionMnistOptions& options = {});
TensorDataset load_fashion_mnist(const std::string& dir, Split split);

}  // namespace paratrain::data

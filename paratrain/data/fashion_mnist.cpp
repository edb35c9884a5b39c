// Fashion-MNIST loader: finds the split's two IDX files, checks that they
// describe the same items, and turns bytes into normalized float images.
#include "paratrain/data/fashion_mnist.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/core/error.h"
#include "paratrain/data/idx.h"

namespace paratrain::data {
namespace {

constexpr const char* kInstallHint =
    "install it with `apt-get install dataset-fashion-mnist`, or set data.dir to a directory holding "
    "the Fashion-MNIST IDX files";

std::string find_file(const std::string& dir, const std::string& stem);

}  // namespace

TensorDataset load_fashion_mnist(const std::string& dir, Split split) {
  FashionMnistOptions options;
  options.dir = dir;
  options.split = split;
  return load_fashion_mnist(options);
}

TensorDataset load_fashion_mnist(const FashionMnistOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(options.dir, ec)) {
    // A file where the folder belongs is a different mistake from a typo.
    const bool exists = fs::exists(options.dir, ec);
    throw DataError(fmt::format("Fashion-MNIST directory {} {}; {}", options.dir,
                                exists ? "is not a directory (data.dir names the folder that holds the "
                                         "*-ubyte.gz files, not a file)"
                                       : "does not exist",
                                kInstallHint));
  }
  const std::string prefix = options.split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_file(options.dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(options.dir, prefix + "-labels-idx1-ubyte");

  const at::Tensor images = read_idx(images_path, {IdxType::kUInt8, 3});
  const at::Tensor labels = read_idx(labels_path, {IdxType::kUInt8, 1});
  if (images.size(0) != labels.size(0)) {
    throw DataError(fmt::format(
        "Fashion-MNIST images/labels count mismatch: {} has {} images but {} has {} labels; "
        "the two files must come from the same split",
        images_path, images.size(0), labels_path, labels.size(0)));
  }
  if (images.size(1) != 28 || images.size(2) != 28) {
    throw DataError(fmt::format("Fashion-MNIST images in {} are {}x{}, expected 28x28", images_path,
                                images.size(1), images.size(2)));
  }
  if (labels.numel() > 0) {
    const int64_t max_label = labels.max().item<int64_t>();
    if (max_label >= kFashionMnistClasses) {
      throw DataError(fmt::format("Fashion-MNIST labels in {} go up to {}, expected 0..9: corrupt file",
                                  labels_path, max_label));
    }
  }

  at::Tensor x = images.to(at::kFloat).div_(255.0f);
  if (options.normalize) x.sub_(kFashionMnistMean).div_(kFashionMnistStd);
  return TensorDataset(x.unsqueeze(1), labels.to(at::kLong));
}

namespace {

// The .gz name Debian ships, or the uncompressed name other mirrors use.
std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path raw = fs::path(dir) / stem;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(raw, ec)) return raw.string();
  throw DataError(fmt::format("Fashion-MNIST file {} (or {}) does not exist; {}", gz.string(),
                              raw.string(), kInstallHint));
}

}  // namespace
}  // namespace paratrain::data

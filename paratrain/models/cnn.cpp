// make_cnn: conv blocks (conv3x3 same-padding, ReLU, 2x2 max-pool) followed by
// two fully connected layers. Registered as conv0.., fc0, fc1.
#include "paratrain/models/cnn.h"
#include "paratrain/models/linear_site.h"
#include "paratrain/models/skeleton.h"
#include "paratrain/quant/activations.h"

#include <string>

#include <torch/torch.h>

namespace paratrain::models {
namespace {

class Cnn final : public Model {
 public:
  explicit Cnn(const CnnOptions& o) : Model("Cnn"), options_(o) {
    TORCH_CHECK(o.in_channels > 0, "CnnOptions.in_channels must be > 0, got ", o.in_channels);
    TORCH_CHECK(o.num_classes > 0, "CnnOptions.num_classes must be > 0, got ", o.num_classes);
    TORCH_CHECK(o.hidden > 0, "CnnOptions.hidden must be > 0, got ", o.hidden);
    TORCH_CHECK(!o.channels.empty(), "CnnOptions.channels must list at least one conv block");
    int64_t c = o.in_channels;
    int64_t side = o.image_size;
    for (size_t i = 0; i < o.channels.size(); ++i) {
      TORCH_CHECK(o.channels[i] > 0, "CnnOptions.channels[", i, "] must be > 0, got ", o.channels[i]);
      convs_.push_back(register_module(
          "conv" + std::to_string(i),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(c, o.channels[i], 3).padding(1))));
      skeletonize(*convs_.back());  // Note [Skeleton models]
      if (o.batchnorm) {
        norms_.push_back(register_module("bn" + std::to_string(i),
                                         torch::nn::Sequential(torch::nn::BatchNorm2d(o.channels[i]))));
        skeletonize(*norms_.back());
      }
      c = o.channels[i];
      side /= 2;  // max_pool2d(2) floors odd sizes
    }
    TORCH_CHECK(side >= 1, "CnnOptions.image_size ", o.image_size, " is too small for ",
                o.channels.size(), " pooling steps (need >= ", 1 << o.channels.size(), ")");
    flat_ = c * side * side;
    fc0_ = register_module("fc0", torch::nn::Linear(flat_, o.hidden));
    skeletonize(*fc0_);
    fc1_ = register_module("fc1", torch::nn::Linear(o.hidden, o.num_classes));
    skeletonize(*fc1_);
  }

  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = x;
    for (auto& layer : layers()) h = layer.forward(h);
    return h;
  }

  // conv<i> blocks (the first reshapes flat input to images), fc0 (flattens
  // the feature maps), fc1.
  std::vector<Layer> layers() override {
    std::vector<Layer> out;
    const CnnOptions o = options_;
    for (size_t i = 0; i < convs_.size(); ++i) {
      torch::nn::Conv2d conv = convs_[i];
      const bool first = i == 0;
      const std::string name = "conv" + std::to_string(i);
      torch::nn::Sequential norm = norms_.empty() ? torch::nn::Sequential(nullptr) : norms_[i];
      std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
      modules.emplace_back(name, conv.ptr());
      if (norm) modules.emplace_back("bn" + std::to_string(i), norm.ptr());
      out.push_back({name, std::move(modules), [conv, norm, first, o](const at::Tensor& x) mutable {
                       at::Tensor h = x;
                       if (first) {
                         const int64_t per_example = o.in_channels * o.image_size * o.image_size;
                         TORCH_CHECK(x.dim() >= 1 && x.numel() == x.size(0) * per_example, "Cnn expects [B, ",
                                     o.in_channels, ", ", o.image_size, ", ", o.image_size,
                                     "] input, got shape ", x.sizes());
                         h = x.reshape({x.size(0), o.in_channels, o.image_size, o.image_size});
                       }
                       h = conv->forward(quant::layer_input(*conv, h));
                       if (norm) h = norm->forward(h);
                       return torch::max_pool2d(torch::relu(h), 2);
                     }});
    }
    torch::nn::Linear fc0 = fc0_, fc1 = fc1_;
    const int64_t flat = flat_;
    out.push_back({"fc0", {{"fc0", fc0.ptr()}}, [fc0, flat](const at::Tensor& x) mutable {
                     return torch::relu(linear_site(*fc0, x.reshape({x.size(0), flat})));
                   }});
    out.push_back({"fc1", {{"fc1", fc1.ptr()}}, [fc1](const at::Tensor& x) mutable {
                     return linear_site(*fc1, x);
                   }});
    return out;
  }

 private:
  CnnOptions options_;
  std::vector<torch::nn::Conv2d> convs_;
  std::vector<torch::nn::Sequential> norms_;  // empty without batchnorm
  torch::nn::Linear fc0_{nullptr}, fc1_{nullptr};
  int64_t flat_ = 0;
};

}  // namespace

std::shared_ptr<Model> make_cnn(const CnnOptions& options) {
  return std::make_shared<Cnn>(options);
}

}  // namespace paratrain::models

// make_cnn: conv blocks (conv3x3 same-padding, ReLU, 2x2 max-pool) followed by
// two fully connected layers. Registered as conv0.., fc0, fc1.
#include "paratrain/models/cnn.h"

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
      c = o.channels[i];
      side /= 2;  // max_pool2d(2) floors odd sizes
    }
    TORCH_CHECK(side >= 1, "CnnOptions.image_size ", o.image_size, " is too small for ",
                o.channels.size(), " pooling steps (need >= ", 1 << o.channels.size(), ")");
    flat_ = c * side * side;
    fc0_ = register_module("fc0", torch::nn::Linear(flat_, o.hidden));
    fc1_ = register_module("fc1", torch::nn::Linear(o.hidden, o.num_classes));
  }

  at::Tensor forward(const at::Tensor& x) override {
    const int64_t per_example = options_.in_channels * options_.image_size * options_.image_size;
    TORCH_CHECK(x.dim() >= 1 && x.numel() == x.size(0) * per_example, "Cnn expects [B, ",
                options_.in_channels, ", ", options_.image_size, ", ", options_.image_size,
                "] input, got shape ", x.sizes());
    at::Tensor h = x.reshape(
        {x.size(0), options_.in_channels, options_.image_size, options_.image_size});
    for (auto& conv : convs_) h = torch::max_pool2d(torch::relu(conv->forward(h)), 2);
    h = torch::relu(fc0_->forward(h.reshape({h.size(0), flat_})));
    return fc1_->forward(h);
  }

 private:
  CnnOptions options_;
  std::vector<torch::nn::Conv2d> convs_;
  torch::nn::Linear fc0_{nullptr}, fc1_{nullptr};
  int64_t flat_ = 0;
};

}  // namespace

std::shared_ptr<Model> make_cnn(const CnnOptions& options) {
  return std::make_shared<Cnn>(options);
}

}  // namespace paratrain::models

// make_mlp: the Linear/ReLU stack behind models::Mlp. Layers are registered
// as fc0..fcN so parameter names are stable across runs and checkpoints.
#include "paratrain/models/mlp.h"
#include "paratrain/models/linear_site.h"
#include "paratrain/models/skeleton.h"
#include "paratrain/quant/activations.h"

#include <string>

#include <torch/torch.h>

namespace paratrain::models {
namespace {

class Mlp final : public Model {
 public:
  explicit Mlp(const MlpOptions& o) : Model("Mlp") {
    TORCH_CHECK(o.in_features > 0, "MlpOptions.in_features must be > 0, got ", o.in_features);
    TORCH_CHECK(o.out_features > 0, "MlpOptions.out_features must be > 0, got ", o.out_features);
    int64_t width = o.in_features;
    for (size_t i = 0; i <= o.hidden.size(); ++i) {
      const int64_t next = i < o.hidden.size() ? o.hidden[i] : o.out_features;
      TORCH_CHECK(next > 0, "MlpOptions.hidden[", i, "] must be > 0, got ", next);
      layers_.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, next)));
      skeletonize(*layers_.back());  // Note [Skeleton models]
      width = next;
    }
    in_features_ = o.in_features;
  }

  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = x;
    for (auto& layer : layers()) h = layer.forward(h);
    return h;
  }

  // fc<i> (+ ReLU but after the last); the first also flattens the input.
  std::vector<Layer> layers() override {
    std::vector<Layer> out;
    const int64_t in = in_features_;
    for (size_t i = 0; i < layers_.size(); ++i) {
      torch::nn::Linear fc = layers_[i];
      const bool first = i == 0, last = i + 1 == layers_.size();
      const std::string name = "fc" + std::to_string(i);
      out.push_back({name, {{name, fc.ptr()}}, [fc, first, last, in](const at::Tensor& x) mutable {
                       at::Tensor h = x;
                       if (first) {
                         TORCH_CHECK(x.dim() >= 1 && x.numel() == x.size(0) * in, "Mlp expects ", in,
                                     " features per example, got input of shape ", x.sizes());
                         h = x.reshape({x.size(0), in});
                       }
                       h = linear_site(*fc, h);
                       return last ? h : torch::relu(h);
                     }});
    }
    return out;
  }

 private:
  std::vector<torch::nn::Linear> layers_;
  int64_t in_features_ = 0;
};

}  // namespace

std::shared_ptr<Model> make_mlp(const MlpOptions& options) {
  return std::make_shared<Mlp>(options);
}

}  // namespace paratrain::models

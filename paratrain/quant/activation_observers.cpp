// RangeRecorder and ActivationQuantizer (activation_observers.h).
#include "paratrain/quant/activation_observers.h"

#include <torch/torch.h>

#include <algorithm>

namespace paratrain::quant {

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> quantized_layers(torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto& m = item.value();
    if (m->as<torch::nn::Linear>() || m->as<torch::nn::Conv2d>()) out.emplace_back(item.key(), m);
  }
  return out;
}

at::Tensor RangeRecorder::at_input(const torch::nn::Module& layer, const at::Tensor& x) {
  const ActivationRange r = range_of(x);
  std::lock_guard lock(mu_);
  auto [it, fresh] = seen_.emplace(&layer, r);
  if (!fresh) {
    it->second.min = std::min(it->second.min, r.min);
    it->second.max = std::max(it->second.max, r.max);
  }
  return x;
}

std::map<std::string, ActivationRange> RangeRecorder::ranges(torch::nn::Module& model) const {
  std::lock_guard lock(mu_);
  std::map<std::string, ActivationRange> out;
  for (const auto& [name, layer] : quantized_layers(model)) {
    if (auto it = seen_.find(layer.get()); it != seen_.end()) out[name] = it->second;
  }
  return out;
}

ActivationQuantizer::ActivationQuantizer(torch::nn::Module& model, int bits,
                                         const std::map<std::string, ActivationRange>& ranges)
    : bits_(bits) {
  activation_grid({0, 1}, bits);  // checks the bits
  const auto layers = quantized_layers(model);
  for (const auto& [name, range] : ranges) {
    auto it = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l.first == name; });
    TORCH_CHECK(it != layers.end(), "activation ranges name '", name, "', which is no Linear or Conv2d of the model");
    grids_[it->second.get()] = activation_grid(range, bits);
  }
}

at::Tensor ActivationQuantizer::at_input(const torch::nn::Module& layer, const at::Tensor& x) {
  if (auto it = grids_.find(&layer); it != grids_.end()) return fake_quantize_grid(x, it->second);
  return fake_quantize_grid(x, activation_grid(range_of(x), bits_));
}

}  // namespace paratrain::quant

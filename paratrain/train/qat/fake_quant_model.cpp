// FakeQuantModel (fake_quant_model.h).
#include "paratrain/train/qat/fake_quant_model.h"

#include <torch/torch.h>

#include "paratrain/quant/quantize.h"

namespace paratrain::train {

FakeQuantModel::FakeQuantModel(std::shared_ptr<models::Model> inner, int bits)
    : Model(inner->name()), inner_(std::move(inner)), bits_(bits) {
  for (const auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
  for (const auto& item : inner_->named_modules("", /*include_self=*/false)) {
    if (auto* linear = item.value()->as<torch::nn::Linear>()) weights_.push_back(&linear->weight);
    if (auto* conv = item.value()->as<torch::nn::Conv2d>()) weights_.push_back(&conv->weight);
  }
}

at::Tensor FakeQuantModel::forward(const at::Tensor& x) {
  if (!active_) return inner_->forward(x);
  // Note [Fake quantization by swapping weights]
  std::vector<at::Tensor> originals;
  originals.reserve(weights_.size());
  for (at::Tensor* w : weights_) {
    originals.push_back(*w);
    *w = quant::fake_quantize(*w, quant::per_channel_scales(*w, bits_), bits_);
  }
  at::Tensor out;
  try {
    out = inner_->forward(x);
  } catch (...) {
    for (size_t i = 0; i < weights_.size(); ++i) *weights_[i] = originals[i];
    throw;
  }
  for (size_t i = 0; i < weights_.size(); ++i) *weights_[i] = originals[i];
  return out;
}

void FakeQuantModel::train(bool on) {
  torch::nn::Module::train(on);
  inner_->train(on);
}

}  // namespace paratrain::train

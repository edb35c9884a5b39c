// FakeQuantModel (fake_quant_model.h).
#include "paratrain/train/qat/fake_quant_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/quant/activation_observers.h"
#include "paratrain/quant/quantize.h"

namespace paratrain::train {

namespace {

constexpr double kRangeDecay = 0.99;  // Note [Learned activation ranges]

// A range buffer's [min, max, observed] (on the CPU, or copied from the
// device the model was moved to).
std::array<float, 3> read_range(const at::Tensor& buffer) {
  const at::Tensor cpu = buffer.is_cpu() ? buffer : buffer.cpu();
  const auto a = cpu.accessor<float, 1>();
  return {a[0], a[1], a[2]};
}

void write_range(at::Tensor& buffer, std::array<float, 3> v) {
  torch::NoGradGuard no_grad;
  buffer.copy_(torch::tensor({v[0], v[1], v[2]}, torch::kFloat));
}

}  // namespace

// The observer of Note [Learned activation ranges]: one buffer per layer
// ([min, max, observed]) and what this rank saw during the current step.
class FakeQuantModel::Activations final : public quant::ActivationObserver {
 public:
  struct Layer {
    std::string name;
    at::Tensor range;  // the buffer
    float seen_min = std::numeric_limits<float>::infinity();
    float seen_max = -std::numeric_limits<float>::infinity();
  };

  Activations(int bits, bool* training) : bits_(bits), training_(training) {}

  at::Tensor at_input(const torch::nn::Module& layer, const at::Tensor& x) override {
    auto it = index_.find(&layer);
    if (it == index_.end()) return x;
    Layer& l = layers_[it->second];
    if (*training_) {
      const quant::ActivationRange r = quant::range_of(x);
      std::lock_guard lock(mu_);
      l.seen_min = std::min(l.seen_min, r.min);
      l.seen_max = std::max(l.seen_max, r.max);
    }
    const auto range = read_range(l.range);
    if (range[2] == 0) return x;  // not observed yet: float
    return quant::fake_quantize_grid(x, quant::activation_grid({range[0], range[1]}, bits_));
  }

  std::vector<Layer> layers_;
  std::map<const torch::nn::Module*, std::size_t> index_;
  std::mutex mu_;

 private:
  int bits_;
  bool* training_;
};

FakeQuantModel::FakeQuantModel(std::shared_ptr<models::Model> inner, int bits, int activation_bits)
    : Model(inner->name()), inner_(std::move(inner)), bits_(bits), activation_bits_(activation_bits) {
  for (const auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
  for (const auto& item : inner_->named_modules("", /*include_self=*/false)) {
    if (auto* linear = item.value()->as<torch::nn::Linear>()) weights_.push_back(&linear->weight);
    if (auto* conv = item.value()->as<torch::nn::Conv2d>()) weights_.push_back(&conv->weight);
  }
  if (activation_bits_ == 0) return;
  quant::activation_grid({0, 1}, activation_bits_);  // checks the bits
  if (inner_->named_children().contains("act_range"))
    throw ConfigError("quant.activation_bits: the model has a child named 'act_range', the name of the learned "
                      "activation ranges; rename it");
  activations_ = std::make_unique<Activations>(activation_bits_, &is_training_cache_);
  auto holder = register_module("act_range", std::make_shared<torch::nn::Module>());
  std::set<std::string> taken;
  for (const auto& [name, layer] : quant::quantized_layers(*inner_)) {
    std::string key = name;
    std::replace(key.begin(), key.end(), '.', '_');
    if (!taken.insert(key).second)
      throw ConfigError(fmt::format("quant.activation_bits: two layers map to the range buffer 'act_range.{}'", key));
    Activations::Layer l;
    l.name = name;
    l.range = holder->register_buffer(key, torch::zeros({3}));
    activations_->index_[layer.get()] = activations_->layers_.size();
    activations_->layers_.push_back(std::move(l));
  }
}

FakeQuantModel::~FakeQuantModel() = default;

at::Tensor FakeQuantModel::forward(const at::Tensor& x) {
  if (!active_) return inner_->forward(x);
  // Note [Fake quantization by swapping weights]
  std::vector<at::Tensor> originals;
  originals.reserve(weights_.size());
  for (at::Tensor* w : weights_) {
    originals.push_back(*w);
    *w = quant::fake_quantize(*w, quant::per_channel_scales(*w, bits_), bits_);
  }
  is_training_cache_ = is_training();
  at::Tensor out;
  try {
    quant::ObserveActivations observe(activations_.get());
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

void FakeQuantModel::update_activation_ranges(comm::ProcessGroup& group, std::chrono::milliseconds timeout,
                                              bool stepped) {
  if (!activations_ || !active_) return;
  auto& layers = activations_->layers_;
  if (!stepped) {
    // A step the loss scaler skipped (the same on every rank): what it saw
    // may hold its overflow; drop it, as the weights dropped its update.
    std::lock_guard lock(activations_->mu_);
    for (auto& l : layers) {
      l.seen_min = std::numeric_limits<float>::infinity();
      l.seen_max = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  // [-min, max] per layer, reduced with max: the global min and max. A
  // layer this rank did not see contributes -inf.
  auto seen = torch::empty({static_cast<int64_t>(layers.size()), 2});
  {
    std::lock_guard lock(activations_->mu_);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      seen[static_cast<int64_t>(i)][0] = -layers[i].seen_min;
      seen[static_cast<int64_t>(i)][1] = layers[i].seen_max;
      layers[i].seen_min = std::numeric_limits<float>::infinity();
      layers[i].seen_max = -std::numeric_limits<float>::infinity();
    }
  }
  if (group.size() > 1) group.all_reduce(seen, comm::ReduceOp::kMax)->wait(timeout);
  torch::NoGradGuard no_grad;
  const auto s = seen.accessor<float, 2>();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const float lo = -s[static_cast<int64_t>(i)][0], hi = s[static_cast<int64_t>(i)][1];
    // No rank saw this layer, or an input was not finite: a range with an
    // inf would make every later grid NaN.
    if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi)) continue;
    auto r = read_range(layers[i].range);
    if (r[2] == 0) {
      r = {lo, hi, 1};
    } else {
      r[0] = static_cast<float>(kRangeDecay * r[0] + (1 - kRangeDecay) * lo);
      r[1] = static_cast<float>(kRangeDecay * r[1] + (1 - kRangeDecay) * hi);
    }
    write_range(layers[i].range, r);
  }
}

std::map<std::string, quant::ActivationRange> FakeQuantModel::activation_ranges() const {
  std::map<std::string, quant::ActivationRange> out;
  if (!activations_) return out;
  for (const auto& l : activations_->layers_) {
    const auto r = read_range(l.range);
    if (r[2] != 0) out[l.name] = {r[0], r[1]};
  }
  return out;
}

}  // namespace paratrain::train

// Int8LinearKernels (int8_kernels.h).
#include "paratrain/quant/int8_kernels.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>
#include <torch/torch.h>

#include <algorithm>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/quant/activation_observers.h"

namespace paratrain::quant {

struct Int8LinearKernels::Packed {
  c10::intrusive_ptr<LinearPackedParamsBase> params;
  int64_t in_features = 0;
};

std::string int8_engine() {
  const auto& engines = at::globalContext().supportedQEngines();
  if (std::find(engines.begin(), engines.end(), at::QEngine::ONEDNN) != engines.end()) return "onednn";
  if (std::find(engines.begin(), engines.end(), at::QEngine::QNNPACK) != engines.end()) return "qnnpack";
  return "";
}

bool int8_reduces_range() {
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
  return int8_engine() == "onednn";  // QNNPACK ignores reduce_range
#else
  return false;
#endif
}

Int8LinearKernels::Int8LinearKernels(torch::nn::Module& model, std::shared_ptr<ActivationObserver> inputs)
    : engine_(int8_engine()), inputs_(std::move(inputs)) {
  if (engine_.empty())
    throw Error("this LibTorch has no quantized engine (oneDNN or QNNPACK) to run int8 Linears on; evaluate with "
                "simulated quantization instead");
  at::globalContext().setQEngine(engine_ == "onednn" ? at::QEngine::ONEDNN : at::QEngine::QNNPACK);
  const auto prepack = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "");
  torch::NoGradGuard no_grad;
  for (const auto& [name, layer] : quantized_layers(model)) {
    auto* linear = layer->as<torch::nn::Linear>();
    if (!linear) continue;
    const at::Tensor w = linear->weight.detach().to(at::kFloat).contiguous();
    const at::Tensor max_abs = w.abs().amax(1);
    const at::Tensor scales = at::where(max_abs > 0, max_abs / 127.0, at::ones_like(max_abs)).to(at::kDouble);
    const at::Tensor qw = at::quantize_per_channel(w, scales, at::zeros({w.size(0)}, at::kLong), 0, at::kQInt8);
    std::vector<c10::IValue> stack{qw, linear->bias.defined() ? c10::IValue(linear->bias.detach().to(at::kFloat))
                                                                 : c10::IValue()};
    prepack.callBoxed(&stack);
    auto packed = std::make_unique<Packed>();
    packed->params = stack.at(0).toCustomClass<LinearPackedParamsBase>();
    packed->in_features = w.size(1);
    packed_[layer.get()] = std::move(packed);
  }
}

Int8LinearKernels::~Int8LinearKernels() = default;

at::Tensor Int8LinearKernels::at_input(const torch::nn::Module& layer, const at::Tensor& x) {
  return inputs_ ? inputs_->at_input(layer, x) : x;
}

at::Tensor Int8LinearKernels::run_linear(const torch::nn::LinearImpl& layer, const at::Tensor& x) {
  const auto it = packed_.find(&layer);
  if (it == packed_.end()) return {};
  const Packed& p = *it->second;
  auto sizes = x.sizes().vec();
  const at::Tensor flat = x.to(at::kFloat).reshape({-1, p.in_features}).contiguous();
  at::Tensor y = p.params->apply_dynamic(flat, int8_reduces_range());  // Note [Int8 kernels]
  sizes.back() = y.size(1);
  return y.view(sizes);
}

}  // namespace paratrain::quant

// The observers of post-training activation quantization (Note [Activation
// sites] in activations.h): one records the ranges of calibration batches,
// the other fake-quantizes every quantized layer's input per tensor, from
// those ranges (static) or from each input's own (dynamic). Quantization-
// aware training's observer is the QAT model's (train/qat/fake_quant_model.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "paratrain/quant/activations.h"

namespace paratrain::quant {

/// The Linear and Conv2d modules of `model`, by name (named_modules()
/// order): the layers whose weights and inputs are quantized.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> quantized_layers(torch::nn::Module& model);

/// Calibration: the range of every input each layer saw while installed
/// (the union over calls); inputs pass unchanged.
class RangeRecorder final : public ActivationObserver {
 public:
  at::Tensor at_input(const torch::nn::Module& layer, const at::Tensor& x) override;
  /// The recorded ranges of `model`'s quantized layers by name; a layer that
  /// saw no input is left out.
  std::map<std::string, ActivationRange> ranges(torch::nn::Module& model) const;

 private:
  mutable std::mutex mu_;
  std::map<const torch::nn::Module*, ActivationRange> seen_;
};

/// Fake-quantizes each quantized layer's input per tensor at `bits`:
/// static (a grid per layer from its range) or, for a layer without one,
/// dynamic (the grid of the input's own range, computed per call).
class ActivationQuantizer final : public ActivationObserver {
 public:
  /// `ranges` by layer name (quantized_layers(model)); empty: all dynamic.
  /// Throws c10::Error for a name that is no quantized layer of `model`.
  ActivationQuantizer(torch::nn::Module& model, int bits, const std::map<std::string, ActivationRange>& ranges = {});
  at::Tensor at_input(const torch::nn::Module& layer, const at::Tensor& x) override;
  int bits() const { return bits_; }

 private:
  int bits_;
  std::map<const torch::nn::Module*, ActivationGrid> grids_;
};

}  // namespace paratrain::quant

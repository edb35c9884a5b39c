// Int8 matmuls on LibTorch's quantized CPU kernels, for running an int8
// file (docs/quantization.md, Kernels).
//
// Note [Int8 kernels]
// Debian's LibTorch 1.13 ships two quantized engines, oneDNN and QNNPACK
// (no FBGEMM). Both take a Linear as a prepacked int8 weight (per output
// channel scales here, zero points 0, as the file stores it) and run it
// "dynamically": the input is quantized per tensor to uint8 by the kernel,
// from its own min and max, the product is accumulated in int32 and the
// output comes back in float32 (PyTorch's dynamic quantization). oneDNN is
// preferred (measured on this x86 machine: int8 Linear 5-9x faster than
// float32; QNNPACK, built for ARM, was slower than float32 on a large
// Linear). The kernel's activation grid is asymmetric (zero point from the
// min), so its results are close to, not equal to, the simulated dynamic
// quantization of Note [Activation sites]; Conv2d layers have no dynamic
// kernel and stay simulated.
// On x86 the input is quantized to 7 bits (0..127, PyTorch's reduce_range,
// its x86 default): without VNNI (AVX-512 VNNI or AVX-VNNI) oneDNN
// multiplies uint8 by int8 with vpmaddubsw, which adds pairs of products
// in int16 and saturates when two large ones meet (255 x 127 x 2 > 32767).
// Measured on an AMD EPYC with AVX2 only: full-range inputs came back up to
// 2.8x past the quantization error bound; 7-bit inputs cannot saturate. The
// same on every x86 machine, so results do not depend on which CPU ran
// them.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

#include "paratrain/quant/activations.h"

namespace paratrain::quant {

/// The quantized engine int8 Linears run on: "onednn", else "qnnpack", else
/// "" (none built into this LibTorch).
std::string int8_engine();

/// Whether the int8 kernels quantize their inputs to 7 bits (x86 on oneDNN: see Note
/// [Int8 kernels]) rather than 8.
bool int8_reduces_range();

/// Runs every Linear of `model` (its current float weights, quantized per
/// output channel at 8 bits) on the int8 kernel of int8_engine(); every
/// other layer's input goes to `inputs` (may be null: unchanged). Selects
/// the engine process-wide. Throws Error when there is none.
class Int8LinearKernels final : public ActivationObserver {
 public:
  Int8LinearKernels(torch::nn::Module& model, std::shared_ptr<ActivationObserver> inputs = nullptr);
  ~Int8LinearKernels() override;

  at::Tensor at_input(const torch::nn::Module& layer, const at::Tensor& x) override;
  at::Tensor run_linear(const torch::nn::LinearImpl& layer, const at::Tensor& x) override;
  const std::string& engine() const { return engine_; }

 private:
  struct Packed;
  std::string engine_;
  std::shared_ptr<ActivationObserver> inputs_;
  std::map<const torch::nn::Module*, std::unique_ptr<Packed>> packed_;
};

}  // namespace paratrain::quant

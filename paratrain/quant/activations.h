// Activation quantization (docs/quantization.md): what a layer's input
// becomes when activations are quantized, for post-training quantization
// (dynamic, or static from calibrated ranges) and quantization-aware
// training (ranges learned as running averages).
//
// Note [Activation sites]
// LibTorch's C++ modules have no forward pre-hooks, so a model says where
// its quantized layers are: it runs each Linear through linear(layer, x)
// and passes each Conv2d's input through layer_input(layer, x) (paratrain's
// MLP, CNN and GPT do; a user's model may). With no observer installed on the calling thread that
// returns x itself: one thread-local read. With one installed
// (ObserveActivations), the observer sees the layer and its input and
// returns what the layer should get instead: the input unchanged while it
// records ranges (calibration), or fake-quantized with the layer's scale.
// Observers are keyed by the layer's address, so the model code names
// nothing; whoever installs one maps names to layers (named_modules()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torch::nn {
class Module;
class LinearImpl;
}

namespace paratrain::quant {

/// An observed range of values (min <= max).
struct ActivationRange {
  float min = 0;
  float max = 0;
};

/// The integer grid of a range at `bits` bits: a nonnegative range (ReLU
/// outputs) uses [0, 2^b - 1] with scale max / (2^b - 1); a signed one the
/// symmetric [-(2^(b-1) - 1), 2^(b-1) - 1] with scale max(|min|, |max|) /
/// (2^(b-1) - 1). Zero is exact on both; a range of zero width gets scale 1.
struct ActivationGrid {
  double scale = 1;
  int64_t lo = 0;
  int64_t hi = 0;
};

/// The grid of `range` at `bits` (2 to 8).
ActivationGrid activation_grid(ActivationRange range, int bits);

/// min and max of `x` (detached; float).
ActivationRange range_of(const at::Tensor& x);

/// dequantize(quantize(x)) on `grid`: clamp(round(x / scale), lo, hi) *
/// scale, with the gradient passed straight through where x lies inside
/// [lo, hi] * scale and zero outside (the straight-through estimator).
at::Tensor fake_quantize_grid(const at::Tensor& x, const ActivationGrid& grid);

/// What a layer's input becomes; see Note [Activation sites].
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  /// `layer` is about to run on `x`: returns its input.
  virtual at::Tensor at_input(const torch::nn::Module& layer, const at::Tensor& x) = 0;
  /// A Linear's whole output computed here instead of by the layer (an int8
  /// kernel: Note [Int8 kernels] in int8_kernels.h), or an undefined tensor:
  /// the layer runs on at_input's result. Only linear() asks.
  virtual at::Tensor run_linear(const torch::nn::LinearImpl& layer, const at::Tensor& x) {
    (void)layer;
    (void)x;
    return {};
  }
};

/// Installs `observer` on the calling thread for this object's lifetime
/// (the previous one, if any, comes back after). Null installs nothing.
class ObserveActivations {
 public:
  explicit ObserveActivations(ActivationObserver* observer);
  ~ObserveActivations();
  ObserveActivations(const ObserveActivations&) = delete;
  ObserveActivations& operator=(const ObserveActivations&) = delete;

 private:
  ActivationObserver* previous_;
};

/// The input `layer` (a Linear or Conv2d) should run on: `x`, or what the
/// thread's observer makes of it. Call it in a model's forward in front of
/// every Conv2d whose activations may be quantized (Linears: linear()).
at::Tensor layer_input(const torch::nn::Module& layer, const at::Tensor& x);

/// `layer` applied to `x` as the thread's observer wants it: its own
/// forward on layer_input(layer, x), unless the observer computes the
/// output itself (run_linear). A model calls it instead of layer->forward(x).
at::Tensor linear(torch::nn::LinearImpl& layer, const at::Tensor& x);

}  // namespace paratrain::quant

// Symmetric integer quantization of tensors (docs/quantization.md, issue 26's
// foundation): weights to int8 (or fewer bits) with float scales per output
// channel or per tensor, back to float, and fake quantization with a
// straight-through gradient for quantization-aware training. Formats and
// kernels that use them build on this; nothing here does I/O.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace paratrain::quant {

/// One scale for the whole tensor, or one per slice along dimension 0 (a
/// Linear's or Conv's output channels).
enum class Granularity { kPerTensor, kPerChannel };

/// Note [Symmetric quantization]
/// With b bits the integers are [-q, q], q = 2^(b-1) - 1 (127 for int8: the
/// symmetric range leaves -128 unused, so negation never overflows and zero
/// is exact). A slice's scale is s = max|w| / q (1 when the slice is all
/// zeros), its values round(w / s) clamped to [-q, q], and dequantization is
/// value * s: every element comes back within s / 2 of where it was. Per
/// output channel, one large row does not coarsen every other row's step
/// (Jacob et al., arXiv 1712.05877; the layout fbgemm's per-channel kernels
/// take).
struct QuantizedTensor {
  at::Tensor values;  ///< int8, the original's shape
  at::Tensor scales;  ///< float32: [1] per tensor, [size(0)] per channel
  Granularity granularity = Granularity::kPerChannel;
  int bits = 8;  ///< 2 to 8; values stay within [-(2^(bits-1) - 1), 2^(bits-1) - 1]
};

/// The largest integer of `bits`-bit symmetric quantization: 2^(bits-1) - 1.
int64_t max_level(int bits);

/// `w` (floating, any shape; per channel needs dim() >= 1) quantized as in
/// Note [Symmetric quantization]. Throws c10::Error for bits outside [2, 8].
QuantizedTensor quantize_symmetric(const at::Tensor& w, int bits = 8, Granularity granularity = Granularity::kPerChannel);

/// The float32 tensor `q` stands for: values * scales (broadcast per channel).
at::Tensor dequantize(const QuantizedTensor& q);

/// Fake quantization for quantization-aware training: the forward is
/// dequantize(quantize(x)) with the given scales (a [1] tensor, or one per
/// slice along dimension 0); the backward passes the gradient straight
/// through where x lies inside the representable range [-q s, q s] and gives
/// zero where it was clamped (the straight-through estimator, Bengio et al.,
/// arXiv 1308.3432, as Jacob et al. use it).
at::Tensor fake_quantize(const at::Tensor& x, const at::Tensor& scales, int bits = 8);

/// The per-output-channel scales quantize_symmetric gives `w` (float32,
/// [size(0)]): fake_quantize(w, per_channel_scales(w, b), b) is
/// dequantize(quantize_symmetric(w, b)).
at::Tensor per_channel_scales(const at::Tensor& w, int bits = 8);

}  // namespace paratrain::quant

// Symmetric quantization and fake quantization (quantize.h).
#include "paratrain/quant/quantize.h"

#include <torch/torch.h>

namespace paratrain::quant {
namespace {

void check_bits(int bits) {
  TORCH_CHECK(bits >= 2 && bits <= 8, "quantization to ", bits, " bits: 2 to 8 bits are supported (int8 storage)");
}

// `scales` shaped to multiply a tensor like `x`: [1] as it is, [C] as
// [C, 1, 1, ...].
at::Tensor broadcastable(const at::Tensor& scales, const at::Tensor& x) {
  if (scales.numel() == 1) return scales.reshape({});
  TORCH_CHECK(x.dim() >= 1 && scales.numel() == x.size(0), "quantization: ", scales.numel(),
              " scales for a tensor of shape ", x.sizes(), " (one per slice along dimension 0, or one)");
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[0] = x.size(0);
  return scales.reshape(shape);
}

// dequantize(quantize(x)) with the gradient passed straight through inside
// the range and zero where the forward clamped.
class FakeQuantize : public torch::autograd::Function<FakeQuantize> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& scales,
                            int64_t levels) {
    const at::Tensor s = broadcastable(scales.to(x.scalar_type()), x);
    // Only the mask is kept for backward, not x: x may be a parameter whose
    // storage a sharding strategy frees and refills between forward and
    // backward (FSDP).
    ctx->save_for_backward({x.abs() <= s * static_cast<double>(levels)});
    return at::clamp(at::round(x / s), -static_cast<double>(levels), static_cast<double>(levels)) * s;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor inside = ctx->get_saved_variables()[0].to(grads[0].scalar_type());
    return {grads[0] * inside, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t max_level(int bits) {
  check_bits(bits);
  return (int64_t{1} << (bits - 1)) - 1;
}

QuantizedTensor quantize_symmetric(const at::Tensor& w, int bits, Granularity granularity) {
  const int64_t q = max_level(bits);
  TORCH_CHECK(at::isFloatingType(w.scalar_type()), "quantize_symmetric: a floating tensor is needed, got ",
              w.scalar_type());
  torch::NoGradGuard no_grad;
  const at::Tensor x = w.detach().to(at::kFloat);
  at::Tensor max_abs;
  if (granularity == Granularity::kPerChannel) {
    TORCH_CHECK(x.dim() >= 1 && x.size(0) >= 1, "quantize_symmetric: per-channel scales need a tensor with a first "
                "dimension, got shape ", x.sizes());
    max_abs = x.reshape({x.size(0), -1}).abs().amax(1);
  } else {
    max_abs = x.abs().max().reshape({1});
  }
  // An all-zero slice keeps scale 1: its values are 0 whatever the scale.
  const at::Tensor scales = at::where(max_abs > 0, max_abs / static_cast<double>(q), at::ones_like(max_abs));
  const at::Tensor s = broadcastable(scales, x);
  QuantizedTensor out;
  out.values = at::clamp(at::round(x / s), -static_cast<double>(q), static_cast<double>(q)).to(at::kChar);
  out.scales = scales.contiguous();
  out.granularity = granularity;
  out.bits = bits;
  return out;
}

at::Tensor dequantize(const QuantizedTensor& q) {
  return q.values.to(at::kFloat) * broadcastable(q.scales.to(at::kFloat), q.values);
}

at::Tensor fake_quantize(const at::Tensor& x, const at::Tensor& scales, int bits) {
  return FakeQuantize::apply(x, scales.detach(), max_level(bits));
}

at::Tensor per_channel_scales(const at::Tensor& w, int bits) {
  torch::NoGradGuard no_grad;
  const at::Tensor max_abs = w.detach().to(at::kFloat).reshape({w.size(0), -1}).abs().amax(1);
  return at::where(max_abs > 0, max_abs / static_cast<double>(max_level(bits)), at::ones_like(max_abs));
}

}  // namespace paratrain::quant

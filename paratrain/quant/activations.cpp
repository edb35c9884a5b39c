// Activation quantization's pieces (activations.h).
#include "paratrain/quant/activations.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace paratrain::quant {
namespace {

thread_local ActivationObserver* t_observer = nullptr;

void check_bits(int bits) {
  TORCH_CHECK(bits >= 2 && bits <= 8, "activation quantization to ", bits, " bits: 2 to 8 bits are supported");
}

// dequantize(quantize(x)) on a grid, straight-through gradient inside it.
class FakeQuantizeGrid : public torch::autograd::Function<FakeQuantizeGrid> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double scale, int64_t lo,
                            int64_t hi) {
    const double low = static_cast<double>(lo) * scale, high = static_cast<double>(hi) * scale;
    ctx->save_for_backward({(x >= low).logical_and_(x <= high)});
    return at::clamp(at::round(x / scale), static_cast<double>(lo), static_cast<double>(hi)) * scale;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor inside = ctx->get_saved_variables()[0].to(grads[0].scalar_type());
    return {grads[0] * inside, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ActivationGrid activation_grid(ActivationRange range, int bits) {
  check_bits(bits);
  ActivationGrid g;
  if (range.min >= 0) {
    g.lo = 0;
    g.hi = (int64_t{1} << bits) - 1;
    g.scale = range.max > 0 ? static_cast<double>(range.max) / static_cast<double>(g.hi) : 1.0;
  } else {
    g.hi = (int64_t{1} << (bits - 1)) - 1;
    g.lo = -g.hi;
    const double m = std::max(std::fabs(static_cast<double>(range.min)), std::fabs(static_cast<double>(range.max)));
    g.scale = m > 0 ? m / static_cast<double>(g.hi) : 1.0;
  }
  return g;
}

ActivationRange range_of(const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  if (x.numel() == 0) return {};
  const auto [lo, hi] = at::aminmax(x.detach().to(at::kFloat));
  return {lo.item<float>(), hi.item<float>()};
}

at::Tensor fake_quantize_grid(const at::Tensor& x, const ActivationGrid& grid) {
  TORCH_CHECK(grid.scale > 0 && grid.lo < grid.hi, "fake_quantize_grid: a grid needs scale > 0 and lo < hi (got ",
              grid.scale, ", [", grid.lo, ", ", grid.hi, "])");
  return FakeQuantizeGrid::apply(x, grid.scale, grid.lo, grid.hi);
}

ObserveActivations::ObserveActivations(ActivationObserver* observer) : previous_(t_observer) {
  if (observer) t_observer = observer;
}

ObserveActivations::~ObserveActivations() { t_observer = previous_; }

at::Tensor layer_input(const torch::nn::Module& layer, const at::Tensor& x) {
  return t_observer ? t_observer->at_input(layer, x) : x;
}

at::Tensor linear(torch::nn::LinearImpl& layer, const at::Tensor& x) {
  if (!t_observer) return layer.forward(x);
  if (at::Tensor y = t_observer->run_linear(layer, x); y.defined()) return y;
  return layer.forward(t_observer->at_input(layer, x));
}

}  // namespace paratrain::quant

// Clipping without a device sync: see clip.h.
#include "paratrain/optim/clip.h"

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>

namespace paratrain::optim {

at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm) {
  // The expressions of torch::nn::utils::clip_grad_norm_ (a Scalar over a
  // tensor is its reciprocal times the Scalar), so the same bits.
  auto coef = max_norm / (norm + 1e-6);
  return at::clamp(coef, c10::nullopt, 1.0);
}

void scale_by_coefficient(const std::vector<at::Tensor>& grads, const at::Tensor& coef) {
  at::NoGradGuard no_grad;
  std::optional<bool> below_one;                // read once, for CPU gradients
  std::map<std::string, at::Tensor> on_device;  // the coefficient moved once per device
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    if (g.is_cpu()) {
      // Not ">= 1": a NaN coefficient (a NaN norm) scales, as LibTorch's does.
      if (!below_one) below_one = !(coef.to(at::kDouble).item<double>() >= 1.0);  // a device coefficient: one sync
      if (*below_one) at::Tensor(g).mul_(coef.to(at::kCPU));
      continue;
    }
    auto& c = on_device[g.device().str()];
    if (!c.defined()) c = coef.to(g.device(), /*non_blocking=*/true);
    at::Tensor(g).mul_(c);
  }
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.detach().norm(2));
  const at::Tensor total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  scale_by_coefficient(grads, clip_coefficient(total, max_norm));
  return total;
}

}  // namespace paratrain::optim

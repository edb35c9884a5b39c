// Shared fixtures of the LARS/LAMB tests: a few tensors shaped like a small
// MLP's (matrices and biases), synthetic gradients per step, and the
// comparison of updates. Not an optimizer: the references live in each test.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <cstdint>
#include <vector>

namespace paratrain::optim::testing {

// W1 [4, 3], b1 [4], W2 [2, 4], b2 [2]: two adapted, two excluded by the 1-D rule.
inline std::vector<std::vector<int64_t>> shapes() { return {{4, 3}, {4}, {2, 4}, {2}}; }

// Leaf tensors requiring grad, values ~ N(0, 1) from `seed`. float64 by
// default: the formula tests compare updates (w_after - w_before), which
// float32 would blur with cancellation against w itself.
inline std::vector<at::Tensor> make_params(uint64_t seed, at::ScalarType dtype = at::kDouble) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> out;
  for (const auto& s : shapes()) out.push_back(at::randn(s, gen, at::TensorOptions().dtype(dtype)).requires_grad_());
  return out;
}

// Gradients for step `step`, shaped like `params`, scale 0.1 (gradients are
// usually much smaller than weights, which is where trust ratios matter).
inline std::vector<at::Tensor> make_grads(const std::vector<at::Tensor>& params, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(at::randn(p.sizes(), gen, p.options().requires_grad(false)) * 0.1);
  return out;
}

inline void set_grads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
}

inline std::vector<at::Tensor> detached_copies(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

// max |a - b| / max |b|: one number per tensor, scale-free.
inline double relative_diff(const at::Tensor& a, const at::Tensor& b) {
  const double denom = b.abs().max().item<double>();
  const double num = (a.to(b.scalar_type()) - b).abs().max().item<double>();
  return denom == 0 ? num : num / denom;
}

// The worst relative_diff of the updates (after - before) over all tensors.
inline double update_diff(const std::vector<at::Tensor>& before, const std::vector<at::Tensor>& after,
                          const std::vector<at::Tensor>& ref_after) {
  double worst = 0;
  for (std::size_t i = 0; i < before.size(); ++i)
    worst = std::max(worst, relative_diff(after[i].detach() - before[i], ref_after[i] - before[i]));
  return worst;
}

// For RecordProperty: measured diffs in the test's XML/JSON report.
inline std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", x);
  return buf;
}

}  // namespace paratrain::optim::testing

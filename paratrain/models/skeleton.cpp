// Skeleton models: see skeleton.h (Note [Skeleton models]).
#include "paratrain/models/skeleton.h"

#include <algorithm>

#include <torch/torch.h>

namespace paratrain::models {
namespace {

thread_local bool t_active = false;
thread_local c10::Device t_device = c10::Device(c10::kCPU);

}  // namespace

SkeletonScope::SkeletonScope(c10::Device device) : was_active_(t_active), was_device_(t_device) {
  t_active = true;
  t_device = device;
}

SkeletonScope::~SkeletonScope() {
  t_active = was_active_;
  t_device = was_device_;
}

bool building_skeleton() { return t_active; }

void skeletonize(torch::nn::Module& layer) {
  if (!t_active) return;
  torch::NoGradGuard no_grad;
  for (auto& p : layer.parameters(/*recurse=*/true)) {
    if (is_placeholder(p)) continue;
    // set_data keeps the parameter's TensorImpl: the module's own handle
    // (e.g. Linear::weight) and its registered entry stay the same tensor.
    p.set_data(at::zeros({1}, p.options().device(t_device).requires_grad(false)).expand(p.sizes()));
  }
}

bool is_placeholder(const at::Tensor& t) {
  if (!t.defined() || t.dim() == 0) return false;
  const auto strides = t.strides();
  return t.storage().nbytes() <= static_cast<size_t>(t.element_size()) &&
         std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; });
}

}  // namespace paratrain::models

// AutocastGuard: see autocast.h. Mirrors what torch.autocast.__enter__ and
// __exit__ do: save the flags and dtypes, set ours, count the nesting, and
// clear the cast cache when the outermost region ends (the cache holds bf16
// copies of fp32 weights, valid only until the optimizer changes them).
#include "paratrain/core/autocast.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

namespace paratrain::core {

AutocastGuard::AutocastGuard(at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "AutocastGuard: compute dtype must be float32, bfloat16 or float16, got ", dtype);
  if (dtype == at::kFloat) return;
  const bool cuda = at::hasCUDA();
  TORCH_CHECK(dtype != at::kHalf || cuda,
              "AutocastGuard: float16 autocast needs a CUDA build (LibTorch 1.13 autocasts CPU ops to bfloat16 "
              "only); use bfloat16 on CPU");
  active_ = true;
  prev_cpu_enabled_ = at::autocast::is_cpu_enabled();
  prev_cpu_dtype_ = at::autocast::get_autocast_cpu_dtype();
  prev_gpu_enabled_ = at::autocast::is_enabled();
  prev_gpu_dtype_ = at::autocast::get_autocast_gpu_dtype();
  if (dtype == at::kBFloat16) {
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::set_cpu_enabled(true);
  }
  if (cuda) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
  }
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(prev_cpu_enabled_);
  at::autocast::set_autocast_cpu_dtype(prev_cpu_dtype_);
  at::autocast::set_enabled(prev_gpu_enabled_);
  at::autocast::set_autocast_gpu_dtype(prev_gpu_dtype_);
}

at::ScalarType parse_compute_dtype(std::string_view name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  TORCH_CHECK(name == "fp16", "compute dtype \"", std::string(name), "\": allowed are \"fp32\", \"bf16\", \"fp16\"");
  return at::kHalf;
}

}  // namespace paratrain::core

// AutocastGuard: an RAII region in which LibTorch's autocast runs eligible
// ops (matmul, conv, linear...) in a lower precision while parameters stay
// fp32 ("master weights"), as torch.autocast in Python. Not here: loss
// scaling (optim/grad_scaler.h) or which region to wrap (the strategies wrap
// forward and loss, never backward: backward ops then run in the dtype their
// forward used, as PyTorch recommends).
//
//   { core::AutocastGuard autocast(at::kBFloat16);   // kFloat: does nothing
//     loss = loss_fn(model->forward(x), y); }
//   loss.backward();
//
// Autocast state (enabled flags, dtypes, the cast cache, the nesting depth)
// is thread-local in LibTorch 1.13, so ranks that are threads of one process
// each have their own; a guard affects only the thread that made it.
#pragma once

#include <c10/core/ScalarType.h>

#include <string_view>

namespace paratrain::core {

class AutocastGuard {
 public:
  // kFloat: a no-op guard (fp32 training). kBFloat16: CPU autocast to bf16
  // (and CUDA autocast to bf16 where the build has CUDA). kHalf: CUDA
  // autocast to fp16; LibTorch 1.13 has no fp16 CPU autocast, so on a
  // CPU-only build this throws c10::Error (the config rejects it first).
  explicit AutocastGuard(at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool prev_cpu_enabled_ = false;
  bool prev_gpu_enabled_ = false;
  at::ScalarType prev_cpu_dtype_ = at::kBFloat16;
  at::ScalarType prev_gpu_dtype_ = at::kHalf;
};

// "fp32" -> kFloat, "bf16" -> kBFloat16, "fp16" -> kHalf; c10::Error otherwise.
at::ScalarType parse_compute_dtype(std::string_view name);

}  // namespace paratrain::core

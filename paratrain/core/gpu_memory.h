// The CUDA caching allocator's peak statistics for one GPU, for logs and
// benchmarks (PyTorch's torch.cuda.max_memory_allocated/reserved): the only
// piece of core that needs CUDA's own headers, compiled with them in CUDA
// builds only.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace paratrain::core {

struct GpuMemoryPeak {
  int64_t allocated = 0;  ///< most bytes held by tensors at once since the process started
  int64_t reserved = 0;   ///< most bytes the caching allocator held from the driver at once
};

/// The peaks of `device` since the process started; nullopt for a CPU device
/// or a build without CUDA.
std::optional<GpuMemoryPeak> gpu_memory_peak(const c10::Device& device);

}  // namespace paratrain::core

// gpu_memory_peak: see gpu_memory.h.
#include "paratrain/core/gpu_memory.h"

#if PARATRAIN_HAVE_CUDA
// LibTorch 2.x's device-generic allocator interface: the CUDA caching
// allocator's statistics without CUDA's own headers.
#include <c10/core/CachingDeviceAllocator.h>
#endif

namespace paratrain::core {

std::optional<GpuMemoryPeak> gpu_memory_peak(const c10::Device& device) {
#if PARATRAIN_HAVE_CUDA
  if (!device.is_cuda()) return std::nullopt;
  const auto stats = c10::getDeviceAllocator(device.type())->getDeviceStats(device.index() < 0 ? 0 : device.index());
  const auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return GpuMemoryPeak{stats.allocated_bytes[all].peak, stats.reserved_bytes[all].peak};
#else
  (void)device;
  return std::nullopt;
#endif
}

}  // namespace paratrain::core

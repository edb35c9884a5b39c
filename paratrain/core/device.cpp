// resolve_device(): see device.h.
#include "paratrain/core/device.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "paratrain/core/error.h"

namespace paratrain::core {

bool cuda_usable() { return at::hasCUDA() && torch::cuda::device_count() > 0; }

c10::Device resolve_device(const std::string& kind, int local_rank) {
  if (kind == "cpu") return c10::Device(c10::kCPU);
  if (kind == "auto") return cuda_usable() ? resolve_device("cuda", local_rank) : c10::Device(c10::kCPU);
  if (kind != "cuda")
    throw ConfigError(fmt::format("world.device = \"{}\": expected \"cpu\", \"cuda\" or \"auto\"", kind));
  if (!at::hasCUDA())
    throw ConfigError("world.device = \"cuda\" needs a CUDA build of LibTorch, and this paratrain is built "
                      "against a CPU-only one (Debian's libtorch-dev): build with scripts/cuda-build.sh, or set "
                      "world.device = \"cpu\" (or \"auto\")");
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (count == 0)
    throw ConfigError("world.device = \"cuda\", but LibTorch sees no GPU on this machine (check nvidia-smi and "
                      "CUDA_VISIBLE_DEVICES), or set world.device = \"cpu\" (or \"auto\")");
  if (local_rank < 0) throw ConfigError(fmt::format("LOCAL_RANK = {} is negative", local_rank));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
}

}  // namespace paratrain::core

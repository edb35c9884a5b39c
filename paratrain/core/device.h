// Where a rank's tensors live: world.device ("cpu" | "cuda" | "auto") and
// LOCAL_RANK turned into an at::Device. Not here: moving anything (the
// Trainer moves its model and batches) or choosing a collective backend.
#pragma once

#include <string>

#include <c10/core/Device.h>

namespace paratrain::core {

/// "cpu" -> CPU; "cuda" -> GPU `local_rank % device_count` (ranks of one node
/// spread over its GPUs, several ranks share one when there are fewer GPUs);
/// "auto" -> "cuda" when this LibTorch has CUDA and sees a GPU, else "cpu".
/// Throws ConfigError for "cuda" on a CPU-only build or a machine without a
/// GPU, and for any other word.
c10::Device resolve_device(const std::string& kind, int local_rank);

/// Whether this LibTorch was built with CUDA and sees at least one GPU.
bool cuda_usable();

}  // namespace paratrain::core

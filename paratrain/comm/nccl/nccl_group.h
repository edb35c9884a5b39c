// The NCCL backend of our ProcessGroup (CUDA builds with NCCL only): c10d's
// ProcessGroupNCCL carries collectives of GPU tensors between GPUs; a host
// group (Gloo, staged) carries what NCCL cannot or should not: CPU tensors
// (the loop's small agreements), barriers, and point-to-point sends, whose
// tags NCCL ignores (it matches sends by order) while pipelines and ring
// attention rely on them. See Note [NCCL beside a host group].
// On a build without NCCL every entry point throws ConfigError naming it.
#pragma once

#include <chrono>
#include <memory>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

/// True when this paratrain was built against a LibTorch with CUDA and
/// c10d's NCCL backend (scripts/cuda-build.sh on a GPU machine).
bool nccl_compiled();

/// GPUs LibTorch sees on this host (0 on a CPU-only build).
int gpus_on_this_host();

/// ConfigError unless world.backend = "nccl" can run here: GPU tensors, a
/// build with NCCL, and a GPU of its own for each of this host's ranks
/// (NCCL refuses two ranks on one GPU, NVIDIA/nccl#418).
void check_nccl_fits(int rank, int local_rank, int local_world_size, bool cpu_tensors);

struct NcclOptions {
  /// Deadline of every operation (what Work::wait() without an argument waits for).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// The GPU this rank drives (cuda:<index>); made the current device.
  int device_index = 0;
};

/// The world's NCCL group of `size` ranks meeting through `store` (a prefix
/// of the job's store no other group uses). `host` is the same ranks' host
/// group, wrapped for GPU tensors (comm/host_staging_group.h): it carries CPU
/// tensors, barriers and send/recv. Collective: every rank calls it; the NCCL
/// communicator is connected before it returns, so a GPU that cannot take
/// part fails here, on every rank, not in the first step.
std::shared_ptr<ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              std::shared_ptr<ProcessGroup> host, const NcclOptions& options);

}  // namespace paratrain::comm

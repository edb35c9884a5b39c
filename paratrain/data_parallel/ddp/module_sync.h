// Making replicas identical: check that every rank holds the same list of
// tensors (names, shapes, dtypes), and broadcast tensors from one rank in a
// few coalesced collectives. Used by DistributedDataParallel and its naive
// twin at construction (parameters and buffers) and before forward (buffers).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::ddp {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// Collective. Throws ConfigError on every rank when some rank's list differs
// from rank 0's in count, element total, or names/shapes/dtypes; `what` names
// the list in the message ("parameters", "buffers").
void verify_same_tensors(comm::ProcessGroup& group, const std::vector<NamedTensor>& tensors,
                         std::string_view what, std::chrono::milliseconds timeout = comm::kDefaultTimeout);

// Collective. Overwrites every rank's `tensors` with root's values (in place,
// without autograd), packing tensors of one dtype and device into flat
// buffers of at most ~32 MiB so a model costs a few collectives, not one per
// tensor.
void broadcast_coalesced(comm::ProcessGroup& group, const std::vector<at::Tensor>& tensors, int root,
                         std::chrono::milliseconds timeout = comm::kDefaultTimeout);

}  // namespace paratrain::ddp

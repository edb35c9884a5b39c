// TpContext: the tensor-parallel group and the timeout every tensor-parallel
// collective waits with, passed explicitly to each mapping and layer (there is
// no global "model-parallel group", unlike Megatron's mpu).
// Not here: building the tp group from the world (topology/DeviceMesh).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "paratrain/comm/process_group.h"

namespace paratrain::tensor_parallel {

struct TpContext {
  // The tensor-parallel group; not owned, must outlive every module and every
  // autograd graph built with this context (backward communicates too).
  comm::ProcessGroup* group = nullptr;
  // Longest wait for each collective; a rank that stops participating makes
  // the others fail with TimeoutError instead of hanging.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;

  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

// Checks that `total` splits evenly over the tp ranks and returns the share
// of one rank. Throws Error naming both numbers, e.g.
// "heads (6) is not divisible by tensor-parallel size (4)".
int64_t divide_evenly(int64_t total, int tp, std::string_view what);

}  // namespace paratrain::tensor_parallel

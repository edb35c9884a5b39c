// A prototype shared-memory all-reduce for ranks on one machine, used only by
// bench/ddp_throughput --comm shm to measure what the proposed intra-node
// backend (design.md roadmap: "intra-node shared memory") would buy DDP.
// Not a library and not a ProcessGroup: float32 sum only, one op at a time in
// issue order, no timeouts beyond the caller's wait(). See
// bench/results/2026-11-21-ddp-cpu.md for the measurements and the proposal.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "paratrain/comm/process_group.h"

namespace paratrain_bench {

struct ShmAllReduceOptions {
  // Largest tensor (elements) one all-reduce may get; the segment holds one
  // slot of this size per rank. DDP: the largest bucket, or all parameters.
  int64_t capacity_numel = 0;
};

class ShmAllReduce {
 public:
  // Collective over `group` (every member on this machine): rank 0 creates
  // the segment, the others map it. Throws paratrain::CommError on failure.
  ShmAllReduce(paratrain::comm::ProcessGroup& group, ShmAllReduceOptions options);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // Sums `tensor` (contiguous float32, <= capacity) over the ranks, in place,
  // on a worker thread; the result is there when the returned work is waited.
  // Every rank must issue the same sequence of calls.
  paratrain::comm::WorkHandle all_reduce_sum(at::Tensor& tensor);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paratrain_bench

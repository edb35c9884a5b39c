// Comm hooks whose collective comes in two phases (a second collective issued
// when the first is seen complete): the 16-bit wire of
// comm/low_precision_all_reduce.h and PowerSGD (powersgd.h).
//
// Note [Second phases on their own group]: a hook's second collective is
// issued lazily, by whichever poll or wait first finds its first phase done.
// With several buckets in flight, one rank may start bucket 0's second phase
// before launching bucket 1 and another after, and Gloo, which pairs
// collectives by issue order, then matches one rank's bucket-0 all-gather
// with the other's bucket-1 all-to-all (and aborts the process). So second
// phases go to a second group with the same members: on it they are issued
// in bucket order on every rank, because the reducer polls and waits its
// buckets in launch order and never looks at bucket k+1 before k completed.
#pragma once

#include <ATen/core/ScalarType.h>

#include <memory>
#include <mutex>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/reducer.h"

namespace paratrain::ddp {

/// A group with the members of the one a hook is called with, made by the
/// hook's first call (a collective on that group, at the same point of every
/// rank's sequence, since buckets launch in the same order everywhere).
class FollowUpGroup {
 public:
  /// The follow-up group of `group` (collective on its first call).
  comm::ProcessGroup& of(comm::ProcessGroup& group);

 private:
  std::mutex mu_;
  comm::ProcessGroup* parent_ = nullptr;
  std::shared_ptr<comm::ProcessGroup> group_;
};

/// DDP's hook for a 16-bit wire (bf16 or fp16) summed in fp32: what
/// precision.comm_dtype and ddp.compression = "bf16" / "fp16" install.
BucketCommHook low_precision_hook(at::ScalarType wire);

}  // namespace paratrain::ddp

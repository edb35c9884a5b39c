// HostStagingGroup: a ProcessGroup decorator that lets a backend which moves
// host memory (our Gloo wrapper's send/recv, shm, hierarchical, MPI) carry
// tensors that live on a GPU. Each operation copies its device tensors to
// host memory, runs the inner operation on the copies, and copies the results
// back to the device when wait() is called.
//
// Why a decorator and not Gloo's own CUDA path: c10d's Gloo stages CUDA
// tensors itself for all-reduce, broadcast and all-gather, but not for
// send/recv (pipeline stages, ring attention), and two thread-ranks of one
// process hung in its CUDA all-reduce on LibTorch 2.11 (tests/train/
// device_test.cpp). Staging once, above every backend, gives every strategy
// and every backend the same GPU path; NCCL (a CUDA build's own collectives)
// is the fast path and wraps only its host group in this (comm/nccl/).
//
// With `overlap` (the default) nothing waits at issue: see Note [Staging off
// the caller's stream] in the .cpp. Without it the copies are synchronous.
#pragma once

#include <chrono>
#include <memory>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct StagingOptions {
  /// Stage CPU tensors too (copies them): lets the CPU test suites run every
  /// operation through the decorator. Production leaves it false: CPU tensors
  /// go to the inner group untouched.
  bool stage_cpu_tensors = false;
  /// What Work::wait() without an argument waits for: the inner group's
  /// timeout (Work keeps it protected, so the decorator is told it).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// Issue without waiting: device-to-host copies on a side stream into
  /// pinned memory, the inner operation started by the group's issuing
  /// thread once its copy is done, in issue order; host-to-device copies at
  /// wait() on the side stream, the waiter's stream ordered after them.
  /// false: synchronous copies at issue and at wait (the first version).
  bool overlap = true;
  /// Start every staged operation on the issuing thread, also those with no
  /// copy to wait for (staged CPU tensors): tests of that path. Operations
  /// started there report bad arguments at wait(), not when issued.
  bool issue_on_thread = false;
};

/// `inner` wrapped so that operations on non-CPU tensors go through host
/// copies. Sub-groups come back wrapped too. Results are in the caller's
/// tensors once Work::wait() returned (for GPU tensors: for work queued on
/// the waiter's current stream after wait()), not when is_completed() turns
/// true.
std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> inner,
                                                 StagingOptions options = {});

}  // namespace paratrain::comm

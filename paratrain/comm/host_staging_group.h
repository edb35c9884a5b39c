// HostStagingGroup: a ProcessGroup decorator that lets a backend which moves
// host memory (our Gloo wrapper's send/recv, shm, hierarchical, MPI) carry
// tensors that live on a GPU. Each operation copies its device tensors to
// host memory, runs the inner operation on the copies, and copies the results
// back to the device when wait() returns.
//
// Why a decorator and not Gloo's own CUDA path: c10d's Gloo stages CUDA
// tensors itself for all-reduce, broadcast and all-gather, but not for
// send/recv (pipeline stages, ring attention), and two thread-ranks of one
// process hung in its CUDA all-reduce on LibTorch 2.11 (tests/train/
// device_test.cpp). Staging once, above every backend, gives every strategy
// and every backend the same GPU path; NCCL (a CUDA build's own collectives)
// is the fast path and is never wrapped.
//
// Cost: a device-to-host copy at issue and a host-to-device copy at wait per
// operation. The copy at issue is synchronous, so an all-reduce issued from a
// backward hook waits for its gradient on the GPU there: correct, but it
// serializes what DDP would overlap.
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
};

/// `inner` wrapped so that operations on non-CPU tensors go through host
/// copies. Sub-groups come back wrapped too. Results are in the caller's
/// tensors once Work::wait() returned (not when is_completed() turns true).
std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> inner,
                                                 StagingOptions options = {});

}  // namespace paratrain::comm

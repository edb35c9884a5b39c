// The intra-node shared-memory backend of our ProcessGroup, for CPU tensors
// of ranks on one host. Collectives copy through one POSIX shared-memory
// segment per group (comm/shm/shm_segment.h) at memory speed instead of
// Gloo's loopback TCP: all_reduce is a reduce-scatter + all-gather where each
// rank reduces its own slice of every chunk, in rank order, so every rank
// gets bitwise the same result (16-bit floats accumulate in fp32).
//
// Native over the segment: all_reduce, reduce, reduce_scatter, all_gather,
// all_gather_uneven, gather, scatter, broadcast, barrier.
// Symmetric memory (allocate_symmetric, comm/shm/shm_symmetric.h): an
// all_reduce of a tensor that lies in it reduces the ranks' copies in place,
// without copying through the segment (Note [Reducing in place]); DDP's
// bucket buffers are allocated there.
// Delegated to a Gloo group built from the same store (rare or
// point-to-point, where the segment's lock-step phases do not fit): send,
// recv, all_to_all.
//
// Operations run in issue order on one worker thread per group; a Work
// completes when the worker finished it. Large tensors go through the
// fixed-size segment in chunks, two in flight (see Note [Shm phases]).
// A peer that dies (pid check), aborts, fails or leaves mid-operation makes
// the waiting ranks fail with CommError at once; one that stops or hangs
// makes them fail with TimeoutError at the group timeout. After any failure
// the group is unusable (its phases are out of step): build a new one.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct ShmOptions {
  // Deadline of every operation (Work::wait() without an argument, and the
  // worker's own bound on waiting for peers); also bounds setup.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Bytes one rank moves per chunk. The segment holds 2 chunks per rank.
  // Small chunks stay in cache between the copy-in and the reduction; very
  // small ones pay a phase barrier (~microseconds each, two per chunk) too
  // often. 1 MiB is a guess between the two, not yet tuned by a sweep.
  std::size_t chunk_bytes = std::size_t{1} << 20;
  // Names the segment in /dev/shm ("paratrain-shm.<job>.<group>.<nonce>"),
  // so a job's segments can be found (and checked gone) by its run id.
  std::string job = "none";
  std::string group = "world";
  // Address of the Gloo group that carries send/recv/all_to_all.
  std::string gloo_bind_address = "127.0.0.1";
};

// Builds the group of `size` ranks meeting through `store`; every rank must
// run on this host. Rank 0 creates the segment, the others map it, then its
// name is removed from /dev/shm. Blocks until done; throws CommError or
// TimeoutError naming the rank and what to do.
std::shared_ptr<ProcessGroup> make_shm_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             const ShmOptions& options);

// $PARATRAIN_SHM_CHUNK_KB (KiB one rank moves per chunk) when set, else
// `fallback`: lets a sweep (bench/run_shm_chunk_sweep.sh) try chunk sizes on
// launched jobs without a config key. Throws ConfigError naming the variable
// unless it is a whole number of KiB in [1, 1048576].
std::size_t shm_chunk_bytes_from_env(std::size_t fallback);

// The /dev/shm name prefix of a job's segments ("paratrain-shm.<job>.").
std::string shm_segment_prefix(const std::string& job);

}  // namespace paratrain::comm

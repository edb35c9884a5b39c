// The Gloo backend of our ProcessGroup: wraps c10d's ProcessGroupGloo (TCP,
// CPU tensors), adds what it lacks (AVG, reduce-scatter, sub-groups) and
// turns its failures into CommError/TimeoutError naming rank and operation.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct GlooOptions {
  // Deadline of every operation (what Work::wait() without an argument
  // waits for, and Gloo's own bound); also bounds connection setup.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Address the Gloo device binds to and advertises to peers. Loopback is
  // right for one machine; multi-node runs need an address peers can reach.
  std::string bind_address = "127.0.0.1";
  // Gloo worker threads per group: with more than one, operations issued
  // back to back may progress concurrently (each is matched across ranks by
  // its sequence number, so results stay right); one thread serialises them.
  int threads = 2;
};

// Builds the group of `size` ranks that meet through `store`. Every rank
// calls it with the same store contents; blocks until all are connected.
std::shared_ptr<ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, const GlooOptions& options);

}  // namespace paratrain::comm

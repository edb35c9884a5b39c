// Multi-rank test harness: run the same function on N ranks, either as N
// threads of this process (each with its own Gloo group over one shared
// in-memory store) or as N real processes through `paratrain launch`.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::testing {

// Runs fn(group) on `world_size` threads, each holding rank `group.rank()` of
// a fresh Gloo world group. Rethrows the first exception any rank threw (after
// all threads finished). Collective timeouts are `timeout`, so a rank that
// stops participating fails the test instead of hanging it.
// Under `mpirun` with PARATRAIN_TEST_BACKEND=mpi the ranks are the MPI
// processes instead: each runs fn once for its own rank over the MPI backend
// (processes beyond `world_size` skip it), so only checks made inside fn count.
// With PARATRAIN_TEST_BACKEND=shm the threads hold shm groups (comm/shm);
// with =hierarchical, hierarchical groups (below).
void run_ranks(int world_size, const std::function<void(comm::ProcessGroup& group)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Same, as threads over an explicit backend: "gloo", "shm" or
// "hierarchical", whatever PARATRAIN_TEST_BACKEND says. "hierarchical":
// comm/hierarchical_group.h over a Gloo world where ranks 2k and 2k+1
// pretend to be node k (4 ranks: 2 nodes of 2), with shm node groups.
void run_ranks_on(const std::string& backend, int world_size,
                  const std::function<void(comm::ProcessGroup& group)>& fn,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60));

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr of the launcher, interleaved
  double seconds = 0;
};

// Runs `build/paratrain <args>` (e.g. {"launch", "--nproc-per-node", "2", "--",
// PARATRAIN_TEST_WORKER, ...}) and captures its output. Kills it after
// `timeout` and reports exit_code = -1.
ProcessResult run_cli(const std::vector<std::string>& args,
                      std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A fresh empty directory under the system temp dir, removed at process exit.
std::string temp_dir(const std::string& prefix);

}  // namespace paratrain::testing

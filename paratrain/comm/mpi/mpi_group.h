// The MPI backend of our ProcessGroup (OpenMPI here: Debian's
// libopenmpi-dev): every operation is MPI's non-blocking counterpart
// (MPI_Iallreduce, MPI_Ialltoallv, MPI_Isend, ...) wrapped as a Work that
// polls MPI_Test until done, so waits honour timeouts and abort() as Gloo's
// do. Rank and size come from MPI itself (mpirun / srun --mpi), so no
// MASTER_ADDR or TCPStore is involved. Sub-groups are communicators split
// from this one.
//
// Needs MPI_THREAD_MULTIPLE (DDP's reducer issues collectives from autograd's
// thread while others may wait): init fails with CommError if the MPI
// library cannot provide it. MPI is initialized on first use and finalized
// at process exit. Where the library was built without MPI, every entry
// point throws ConfigError saying how to get it.
//
// Differences from Gloo worth knowing:
// - abort() fails this process's waits at once, but MPI cannot cancel a
//   collective: peers notice only when this process exits (mpirun then ends
//   the job) or at their own timeout.
// - new_subgroup() is MPI_Comm_split: blocking, without a timeout.
// - bf16/fp16 reductions use our own MPI ops (fp32 arithmetic per element);
//   MPI has no 16-bit float types.
#pragma once

#include <chrono>
#include <memory>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct MpiOptions {
  // Deadline of every operation (what Work::wait() without an argument waits for).
  std::chrono::milliseconds timeout = kDefaultTimeout;
};

// True when this build has the MPI backend.
bool mpi_compiled();
// True when this process looks started by an MPI launcher (OpenMPI's
// OMPI_COMM_WORLD_SIZE, or PMI_SIZE / PMIX_RANK).
bool launched_by_mpi();

// The group of every process of MPI_COMM_WORLD. Initializes MPI if needed.
std::shared_ptr<ProcessGroup> make_mpi_world_group(const MpiOptions& options = {});

}  // namespace paratrain::comm

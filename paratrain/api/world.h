// init_from_env(): the one call a user's training program makes to join the
// job. Reads the rank and world size that torchrun, `paratrain launch`,
// mpirun or srun put in the environment, meets the other ranks and returns
// the world group. Not here: the rendezvous itself (comm/rendezvous.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "paratrain/comm/process_group.h"
#include "paratrain/comm/rendezvous.h"

namespace paratrain {

/// What init_from_env() needs beyond the environment.
struct InitOptions {
  /// How long to wait for every rank, and every collective's default deadline.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// Log level of paratrain's own lines (spdlog); PARATRAIN_LOG_LEVEL wins.
  std::string log_level = "info";
  /// One intra-op thread per rank when several ranks share this machine and
  /// OMP_NUM_THREADS is unset: N ranks x all cores each would oversubscribe.
  bool one_thread_per_local_rank = true;
  /// "gloo", "mpi", "shm" or "auto" (see comm/rendezvous.h). Empty: the
  /// PARATRAIN_BACKEND that `paratrain launch --backend` sets, else "gloo".
  std::string backend;
};

/// The job as this process sees it. Copyable; copies share the group.
class World {
 public:
  /// Built by init_from_env(); tests may build one around their own group.
  World(comm::WorldInfo info, std::shared_ptr<comm::ProcessGroup> group);

  int rank() const { return info_.rank; }             ///< this process's rank in the job
  int size() const { return info_.world_size; }       ///< processes in the job
  int local_rank() const { return info_.local_rank; }  ///< rank among the processes of this host
  bool is_main() const { return info_.rank == 0; }    ///< rank 0: the one that logs and writes
  /// Where rank and size came from: "torchrun", "openmpi", "slurm", "default".
  const comm::WorldInfo& info() const { return info_; }
  /// Every rank of the job; what DistributedDataParallel & co. take.
  comm::ProcessGroup& group() const { return *group_; }
  /// The same group, shared (for wrappers that keep it alive).
  const std::shared_ptr<comm::ProcessGroup>& group_ptr() const { return group_; }
  /// Collective: returns once every rank called it.
  void barrier() const;

 private:
  comm::WorldInfo info_;
  std::shared_ptr<comm::ProcessGroup> group_;
};

/// Collective over the whole job. Without any launcher variables this is a
/// world of one (rank 0), so the same program runs alone too. Throws
/// ConfigError on inconsistent variables and TimeoutError naming the ranks
/// that never arrived.
World init_from_env(const InitOptions& options = {});

}  // namespace paratrain

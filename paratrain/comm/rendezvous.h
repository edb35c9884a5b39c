// Rendezvous: who am I, how many are we, where is the store. Reads the
// environment of torchrun / `paratrain launch`, OpenMPI (mpirun) or Slurm
// (srun), then meets every rank through a c10d TCPStore and builds the world
// process group. A rank that never arrives is a TimeoutError naming it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where the values came from: "torchrun", "openmpi", "slurm" or "default".
  std::string source = "default";
  // Where master_addr came from, for errors: "MASTER_ADDR", "SLURM_JOB_NODELIST" or "default".
  std::string master_addr_source = "default";
  // torchelastic's restart environment (torchrun, `paratrain launch`):
  // TORCHELASTIC_RESTART_COUNT is this worker's generation (> 0 after a
  // restart: `paratrain train` then resumes), TORCHELASTIC_RUN_ID the job id.
  // Both go into every rendezvous key, so workers of an earlier generation or
  // another job that reach the same store are never counted.
  int restart_count = 0;
  std::string run_id = "none";
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves a
  // TCPStore at master_addr:master_port, so rank 0 connects to it as a client
  // instead of serving one (which would fail: the port is taken).
  bool use_agent_store = false;
  // PARATRAIN_AGENT_STORE=auth (set by `paratrain launch`, whose agent serves
  // the store for the whole launch): the agent store is comm/auth_store's,
  // so every rank (rank 0 too) connects an AuthStore client with
  // PARATRAIN_JOB_TOKEN. Unset or "tcp": a TCPStore client, as under torchrun.
  bool agent_store_authenticated = false;
};

// torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT) win; then OMPI_COMM_WORLD_*; then SLURM_*; else a
// single process. TORCHELASTIC_* are read whatever the source. Throws
// ConfigError naming the variable on a malformed value, and on inconsistent
// values (rank >= size...).
// Every count and index is checked against its range before it becomes an
// int (comm/world_env.cpp, Note [Bounds on the environment]): the error
// names the variable, its value and the range.
WorldInfo world_from_env();

// Throws ConfigError on inconsistent values (rank >= world_size, a port
// outside 1..65535...). world_from_env() and init_process_group() call it.
void validate_world(const WorldInfo& world);


// The store namespace of one generation of one job:
// "paratrain/<run_id>/gen<restart_count>". Every rendezvous key lives under it.
std::string rendezvous_prefix(const WorldInfo& world);

// Throws ConfigError when master_addr does not resolve to an address (a typo,
// or a SLURM_JOB_NODELIST host this node cannot resolve), naming the host and
// where it came from. Called by init_process_group before it meets the store,
// instead of letting the store retry a name that can never connect.
void check_master_resolves(const WorldInfo& world);

struct InitOptions {
  // How long to wait for every rank to arrive, and the default for every
  // collective afterwards. Short values make failures surface sooner.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // "gloo" (TCP), "mpi" (comm/mpi: rank and size from MPI itself, no store),
  // "shm" (comm/shm: shared memory, every rank on one host; ConfigError
  // otherwise), "hierarchical" (comm/hierarchical_group.h: all-reduce in
  // shared memory inside each host and over Gloo among one leader per host;
  // hosts told apart by name, $PARATRAIN_NODE_NAME overriding it) or "auto"
  // (mpi when started by mpirun and built with MPI, else nccl when not
  // cpu_tensors, the build has NCCL and each rank of a host has its own GPU,
  // else shm when all ranks share this host and cpu_tensors, else
  // hierarchical when several hosts have several ranks each and cpu_tensors,
  // else gloo). "nccl" (comm/nccl/, CUDA builds): GPU collectives over NCCL,
  // CPU tensors, barriers and send/recv over a staged Gloo group.
  std::string backend = "gloo";
  // Whether the job's tensors live in CPU memory; "auto" picks shm only then.
  bool cpu_tensors = true;
  // Address this rank's Gloo device binds to. Empty: $PARATRAIN_BIND_ADDR,
  // else loopback when every rank runs on this machine, else this host's
  // name (which must resolve to an address the other nodes can reach).
  std::string bind_address;
  // Hang doctor: the world group (and every sub-group made from it) records
  // its last `doctor_records` collectives in a ring buffer
  // (comm/doctor/recording_group.h); 0 returns the backend's group unwrapped.
  std::size_t doctor_records = 256;
  // Runs once this rank's check-in completed, before any group is built
  // (tests: a rank that dies between the two).
  std::function<void()> after_check_in;
};

// The address this rank's Gloo device binds to and advertises to its peers
// (options.bind_address, $PARATRAIN_BIND_ADDR, loopback for a one-host job,
// else the interface that routes to MASTER_ADDR). The peer watch
// (comm/peer_watch.h) listens for heartbeats on it too.
std::string rank_address(const WorldInfo& world, const InitOptions& options = {});

// Connects to (rank 0: serves) the TCPStore at master_addr:master_port, waits
// until all ranks checked in, then builds the world group.
std::shared_ptr<ProcessGroup> init_process_group(const WorldInfo& world,
                                                 const InitOptions& options = {});

class Rejoiner;
// elastic.in_job: the world group and a Rejoiner (comm/rejoin.h) over the
// same store and generation, for the membership rounds after a rank dies.
// The rounds need the store: while rank 0 serves it, rank 0 dying ends the
// job. Gloo only (ConfigError otherwise): the rebuilt worlds are Gloo groups.
struct ElasticWorld {
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<Rejoiner> rejoiner;
};
ElasticWorld init_elastic_process_group(const WorldInfo& world, const InitOptions& options,
                                        std::chrono::milliseconds rejoin_window);

}  // namespace paratrain::comm

// Rendezvous from the environment: torchrun / paratrain launch, OpenMPI, Slurm.
#include "paratrain/comm/rendezvous.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/mpi/mpi_group.h"
#include "paratrain/comm/nccl/nccl_group.h"
#include "paratrain/comm/host_staging_group.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/comm/rejoin.h"
#include "paratrain/comm/route.h"
#include "paratrain/comm/hierarchical_group.h"
#include "paratrain/comm/shm/shm_group.h"
#include "paratrain/comm/store_checkin.h"
#include "paratrain/comm/store_connect.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

// The address this rank's Gloo device binds to and advertises. Loopback only
// when the whole job runs on this machine: on a multi-node job even the
// master's node must advertise an address the other nodes can reach. That
// is the address of the interface that routes to the master, not what this
// host's name resolves to: Debian's /etc/hosts maps the name to 127.0.1.1,
// containers and network namespaces to 127.0.0.1 or to another namespace's
// address, and a loopback device advertised to other nodes hangs the job
// at start-up (docs/elastic.md, "Multi-node across network namespaces").
// The host name stays the fallback when no route is found.
std::string bind_address_for(const WorldInfo& world, const InitOptions& options) {
  if (!options.bind_address.empty()) return options.bind_address;
  if (auto addr = env::get("PARATRAIN_BIND_ADDR")) return *addr;
  if (world.local_world_size == world.world_size && is_local_address(world.master_addr)) return "127.0.0.1";
  const std::string routed = source_address_towards(world.master_addr, world.master_port);
  if (!routed.empty() && routed.rfind("127.", 0) != 0 && routed != "::1") return routed;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// PARATRAIN_STAGING_OVERLAP=0 stages GPU tensors with synchronous copies, as
// the first version did (comm/host_staging_group.h): for measuring what the
// overlap buys (scripts/cuda-check.sh).
bool staging_overlap() { return env::get_or("PARATRAIN_STAGING_OVERLAP", "1") != "0"; }

// world.backend = "auto": MPI when mpirun started us (its own transports,
// and the ranks MPI knows); else NCCL when tensors live on GPUs and each rank
// of this host has a GPU of its own (a CUDA build); else shared memory when
// every rank runs on this host and tensors live in CPU memory (memory speed instead of loopback
// TCP: bench/results/2026-11-24-shm.md); else Gloo. Rank 0 logs the choice.
std::string choose_backend(const WorldInfo& world, const InitOptions& options) {
  std::string backend, why;
  if (mpi_compiled() && launched_by_mpi()) {
    backend = "mpi";
    why = "started by an MPI launcher and built with MPI";
  } else if (!options.cpu_tensors && nccl_compiled() && world.local_world_size <= gpus_on_this_host()) {
    backend = "nccl";
    why = fmt::format("GPU tensors and a GPU for each of the {} rank(s) on this host", world.local_world_size);
  } else if (world.world_size > 1 && world.local_world_size == world.world_size && options.cpu_tensors) {
    backend = "shm";
    why = fmt::format("all {} ranks on one host with CPU tensors", world.world_size);
  } else if (world.local_world_size > 1 && world.world_size > world.local_world_size && options.cpu_tensors) {
    // Only one rank per host then crosses the network per all-reduce
    // (Note [Hierarchical all-reduce], comm/hierarchical_group.cpp).
    backend = "hierarchical";
    why = fmt::format("{} ranks on several hosts, {} per host, CPU tensors: shared memory inside each host, Gloo "
                      "among one leader per host",
                      world.world_size, world.local_world_size);
  } else {
    backend = "gloo";
    why = world.world_size == 1                            ? "a single rank"
          : world.local_world_size != world.world_size ? "ranks span several hosts"
          : !options.cpu_tensors                       ? "tensors are not in CPU memory"
                                                       : "default";
  }
  if (world.rank == 0) spdlog::info("world.backend = \"auto\" chose {}: {}", backend, why);
  return backend;
}

// The environment's LOCAL_WORLD_SIZE can be wrong (hand-set variables, a
// launcher per host that sets it per host): every rank publishes its host
// name and all compare, so shm across hosts is a ConfigError naming both
// hosts instead of a missing /dev/shm segment.
void check_one_host(c10d::Store& store, const WorldInfo& world) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::string mine = host;
  store.set(fmt::format("host/{}", world.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  for (int r = 0; r < world.world_size; ++r) {
    const auto v = store.get(fmt::format("host/{}", r));
    const std::string theirs(v.begin(), v.end());
    if (theirs != mine)
      throw ConfigError(fmt::format("world.backend = \"shm\" needs every rank on one host: rank {} runs on '{}', "
                                    "rank {} on '{}'. Use world.backend = \"gloo\" (or \"auto\") across hosts",
                                    world.rank, mine, r, theirs));
  }
}

}  // namespace

std::string rendezvous_prefix(const WorldInfo& world) {
  return fmt::format("paratrain/{}/gen{}", world.run_id, world.restart_count);
}

void check_master_resolves(const WorldInfo& world) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(world.master_addr.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  // EAI_AGAIN is the resolver failing for now, not the name: the store's
  // own retries and timeout handle a name server that comes back.
  if (rc == 0 || rc == EAI_AGAIN) return;
  throw ConfigError(fmt::format("rank {}: the store host '{}' ({}) does not resolve: {}. Fix the name, or set "
                                "MASTER_ADDR to an address every rank reaches",
                                world.rank, world.master_addr, world.master_addr_source, gai_strerror(rc)));
}

namespace {
// `elastic`, when given, receives the job's store and the Gloo options of the world.
struct ElasticParts {
  c10::intrusive_ptr<c10d::Store> job_store;
  GlooOptions gloo;
};
std::shared_ptr<ProcessGroup> backend_group(const WorldInfo& world, const InitOptions& options,
                                            ElasticParts* elastic = nullptr);
std::shared_ptr<ProcessGroup> with_recorder(std::shared_ptr<ProcessGroup> group, const WorldInfo& world,
                                            const InitOptions& options);
}  // namespace

ElasticWorld init_elastic_process_group(const WorldInfo& world, const InitOptions& options,
                                        std::chrono::milliseconds rejoin_window) {
  std::string backend = options.backend == "auto" ? "gloo" : options.backend;
  if (backend != "gloo") {
    throw ConfigError(fmt::format("elastic.in_job = true needs world.backend = \"gloo\" (or \"auto\"), got \"{}\": "
                                  "the survivors rebuild their world as a Gloo group",
                                  options.backend));
  }
  InitOptions gloo_only = options;
  gloo_only.backend = "gloo";
  ElasticParts parts;
  ElasticWorld out;
  std::shared_ptr<ProcessGroup> group;
  std::string ended;
  try {
    group = backend_group(world, gloo_only, &parts);
  } catch (const CommError& e) {
    // CheckInEnded, or a connection to a peer that already saw it and
    // dropped its half-built group: either way the check-in was ended.
    if (!parts.job_store || !check_in_ended(*parts.job_store)) throw;
    ended = e.what();
  }
  RejoinOptions rejoin;
  rejoin.window = rejoin_window;
  rejoin.gloo = parts.gloo;
  out.rejoiner = std::make_shared<Rejoiner>(parts.job_store, "elastic", rejoin);
  if (ended.empty()) {
    out.group = with_recorder(std::move(group), world, options);
    return out;
  }
  // Note [Shrinking at start-up]
  // Under elastic.in_job the user chose to go on without a rank that dies.
  // One that dies before the world is built (before its check-in, or after
  // it but before it published its address) makes the launcher end the
  // check-in (Note [Ending a check-in] in comm/store_checkin.cpp); the
  // survivors then meet in in-job recovery's membership round (rejoin.h)
  // and build the world among themselves, renumbered in the old order.
  // Nothing was trained yet, so this is a start at the smaller size: the
  // config is read at that size (the per-rank batch, or
  // data.global_batch_size over the survivors), and it is the size the run
  // started with for elastic.keep_global_batch later.
  const Membership m = out.rejoiner->rejoin(world.rank, world.world_size);
  WorldInfo shrunk = world;
  shrunk.rank = m.rank;
  shrunk.world_size = static_cast<int>(m.survivors.size());
  if (m.rank == 0) {
    const auto dead = m.dead();
    spdlog::warn("elastic.in_job: rank(s) {} of {} died before the world was built ({}); the {} survivors start "
                 "without them as ranks 0-{} (old ranks {})",
                 fmt::join(dead, ","), world.world_size, ended, m.survivors.size(), m.survivors.size() - 1,
                 fmt::join(m.survivors, ","));
  }
  out.group = with_recorder(m.group, shrunk, options);
  return out;
}

std::shared_ptr<ProcessGroup> init_process_group(const WorldInfo& world, const InitOptions& options) {
  return with_recorder(backend_group(world, options), world, options);
}

namespace {
// The layers every world group gets above its backend: host staging for GPU
// tensors (comm/host_staging_group.h), then the hang doctor's recorder.
std::shared_ptr<ProcessGroup> with_recorder(std::shared_ptr<ProcessGroup> group, const WorldInfo& world,
                                            const InitOptions& options) {
  // NCCL carries GPU tensors itself (its host group is staged inside it).
  if (!options.cpu_tensors && group->backend() != "nccl") {
    StagingOptions staging;
    staging.timeout = options.timeout;
    staging.overlap = staging_overlap();
    group = stage_through_host(std::move(group), staging);
  }
  if (options.doctor_records == 0) return group;
  // One recorder per rank, shared by every group of the rank; registered so
  // that SIGUSR1 (comm/doctor/doctor_watchdog.h) can dump it.
  auto recorder = std::make_shared<FlightRecorder>(world.rank, options.doctor_records);
  register_recorder(recorder);
  RecordingOptions recording;
  recording.name = "world";
  recording.timeout = options.timeout;
  return record_collectives(std::move(group), std::move(recorder), recording);
}

std::shared_ptr<ProcessGroup> backend_group(const WorldInfo& world, const InitOptions& options,
                                            ElasticParts* elastic) {
  validate_world(world);
  std::string backend = options.backend;
  if (backend == "auto") backend = choose_backend(world, options);
  if (backend == "mpi") {
    // Under srun without PMIx, OpenMPI's MPI_Init aborts the process with
    // "OMPI was not built with SLURM's PMI support", which no handler sees:
    // say what to do before calling it.
    if (world.source == "slurm" && !launched_by_mpi())
      throw ConfigError("world.backend = \"mpi\" under srun: srun started these tasks without PMIx, so MPI cannot "
                        "find its peers (OpenMPI would abort: \"OMPI was not built with SLURM's PMI support\"). "
                        "Start them with `srun --mpi=pmix ...`, or use world.backend = \"gloo\" (srun's "
                        "variables give the ranks; the store is on the allocation's first node)");
    MpiOptions mpi;
    mpi.timeout = options.timeout;
    auto group = make_mpi_world_group(mpi);
    if (group->size() != world.world_size || group->rank() != world.rank)
      throw ConfigError(fmt::format("world.backend = \"mpi\": MPI says rank {} of {}, the environment ({}) says "
                                    "rank {} of {}. The MPI backend needs its ranks started by MPI: run `mpirun -np {} paratrain train ...` "
                                    "(not paratrain launch or torchrun, which start processes MPI does not know), "
                                    "or use world.backend = \"gloo\"",
                                    group->rank(), group->size(), world.source, world.rank, world.world_size,
                                    world.world_size));
    return group;
  }
  if (backend != "gloo" && backend != "shm" && backend != "hierarchical" && backend != "nccl") {
    throw ConfigError(fmt::format("world.backend '{}' is not a backend: use \"gloo\", \"mpi\", \"shm\", "
                                  "\"hierarchical\", \"nccl\" or \"auto\"",
                                  options.backend));
  }
  if (backend == "nccl") check_nccl_fits(world.rank, world.local_rank, world.local_world_size, options.cpu_tensors);
  if (backend == "shm" && world.local_world_size != world.world_size)
    throw ConfigError(fmt::format("world.backend = \"shm\" needs every rank on one host, but this job has {} "
                                  "ranks with {} per host ({}); use world.backend = \"gloo\" (or \"auto\")",
                                  world.world_size, world.local_world_size, world.source));
  std::string where = fmt::format("TCPStore at {}:{}", world.master_addr, world.master_port);
  c10::intrusive_ptr<c10d::Store> store;
  if (world.world_size == 1) {
    // Nobody to meet: an in-process store, so single-process runs never
    // compete for MASTER_PORT with each other or with other jobs.
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    check_master_resolves(world);
    store = connect_store(world, options, where);
  }
  // Every key of this rendezvous lives under the job's id and generation:
  // see Note [Restarting workers] in launch/launcher.cpp. torchrun's agent
  // store outlives generations, so without the generation a restarted rank
  // would find the old check-ins and go on before its peers arrived.
  auto job_store = c10::make_intrusive<c10d::PrefixStore>(rendezvous_prefix(world), store);
  // Known before the check-in: elastic.in_job's survivors need them even when
  // the world is never built (Note [Shrinking at start-up]).
  if (elastic != nullptr) {
    elastic->job_store = job_store;
    elastic->gloo.timeout = options.timeout;
    elastic->gloo.bind_address = bind_address_for(world, options);
  }
  try {
    check_in(*job_store, world.rank, world.world_size, options.timeout, where);
  } catch (const c10::Error& e) {
    // c10d's TCPStore client gets bytes it cannot parse: most often a rank
    // started without the token meeting the authenticated store.
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    if (msg.find("response expected") == std::string::npos) throw;
    throw CommError(fmt::format("rank {}: the {} answered with bytes the TCPStore protocol does not expect ({}): "
                                "it is probably the authenticated store of a job with a token; set "
                                "PARATRAIN_JOB_TOKEN to that job's token, or check MASTER_PORT",
                                world.rank, where, msg));
  }

  if (options.after_check_in) options.after_check_in();
  // Connection setup ends when the launcher ends the check-in (a rank that
  // died before publishing its address): Note [Ending a check-in].
  const auto connect_store = ending_with_check_in(job_store, world.rank, where);
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", connect_store);
  if (backend == "shm") {
    check_one_host(*connect_store, world);
    ShmOptions shm;
    shm.timeout = options.timeout;
    shm.job = fmt::format("{}.gen{}", world.run_id, world.restart_count);
    shm.chunk_bytes = shm_chunk_bytes_from_env(shm.chunk_bytes);
    return make_shm_group(world_store, world.rank, world.world_size, shm);
  }
  GlooOptions gloo;
  gloo.timeout = options.timeout;
  gloo.bind_address = bind_address_for(world, options);
  auto flat = make_gloo_group(world_store, world.rank, world.world_size, gloo);
  if (backend == "nccl") {
    // The host group carries CPU tensors, barriers and tagged send/recv
    // (Note [NCCL beside a host group], comm/nccl/nccl_group.cpp).
    StagingOptions staging;
    staging.timeout = options.timeout;
    staging.overlap = staging_overlap();
    NcclOptions nccl;
    nccl.timeout = options.timeout;
    nccl.device_index = world.local_rank % std::max(1, gpus_on_this_host());
    return make_nccl_group(c10::make_intrusive<c10d::PrefixStore>("nccl", connect_store), world.rank, world.world_size,
                           stage_through_host(std::move(flat), staging), nccl);
  }
  if (backend != "hierarchical") return flat;
  // Gloo among the hosts; inside each, shared memory for CPU tensors (a Gloo
  // sub-group otherwise). $PARATRAIN_NODE_NAME overrides the host name, so
  // ranks of one machine can act as several nodes (tests, trials).
  HierarchicalOptions h;
  h.timeout = options.timeout;
  h.node = env::get_or("PARATRAIN_NODE_NAME", "");
  if (options.cpu_tensors) {
    h.make_node_group = [&](const NodeLayout& layout) {
      ShmOptions shm;
      shm.timeout = options.timeout;
      shm.job = fmt::format("{}.gen{}", world.run_id, world.restart_count);
      shm.group = fmt::format("node{}", layout.node);
      shm.chunk_bytes = shm_chunk_bytes_from_env(shm.chunk_bytes);
      auto node_store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("node{}", layout.node), connect_store);
      return make_shm_group(node_store, layout.local_rank, static_cast<int>(layout.local_ranks.size()), shm);
    };
  }
  auto group = make_hierarchical_group(std::move(flat), h);
  if (world.rank == 0) spdlog::info("world.backend = \"hierarchical\": {}", group->backend());
  return group;
}

}  // namespace

std::string rank_address(const WorldInfo& world, const InitOptions& options) {
  return bind_address_for(world, options);
}

}  // namespace paratrain::comm

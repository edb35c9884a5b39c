// Rendezvous from the environment: torchrun / paratrain launch, OpenMPI, Slurm.
#include "paratrain/comm/rendezvous.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/comm/auth_store/server.h"
#include "paratrain/comm/auth_store/store.h"
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
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

bool is_local_address(const std::string& addr) {
  if (addr == "127.0.0.1" || addr == "localhost" || addr == "::1") return true;
  char host[256] = {0};
  return gethostname(host, sizeof host - 1) == 0 && addr == host;
}

// Note [Authenticated rendezvous]
// c10d's TCPStore admits anyone who reaches its port, listens on every
// interface, and has no notion of a job: another user's process could join a
// job as a rank, and a second job on the same port attached to the first.
// With PARATRAIN_JOB_TOKEN set (`paratrain launch` sets a fresh one per job)
// rank 0 serves comm/auth_store instead: a client is admitted only after
// proving with an HMAC over a fresh challenge that it knows the token and
// names the same job id (TORCHELASTIC_RUN_ID), and the server proves the
// same back. It listens on loopback when the whole job runs on this machine,
// else on MASTER_ADDR's address, or where PARATRAIN_STORE_BIND says.
// Under `paratrain launch` the launcher (the agent) serves that store for the
// whole launch (launch/agent_store.h) and sets TORCHELASTIC_USE_AGENT_STORE=True
// with PARATRAIN_AGENT_STORE=auth: then every rank, rank 0 included, is an
// AuthStore client, and a worker's death never takes the store down.
// Without a token (hand-started or torchrun jobs), under torchrun's agent
// store (a TCPStore: no PARATRAIN_AGENT_STORE), or without libsodium, the
// TCPStore path below stays as it was. docs/launchers.md says what the
// token does not protect (Gloo's own connections).

// PARATRAIN_JOB_TOKEN, when set. An empty token would be a secret everyone
// knows: refused rather than silently unauthenticated.
std::optional<std::string> job_token() {
  const char* token = std::getenv("PARATRAIN_JOB_TOKEN");  // env::get would read "" as unset
  if (token == nullptr) return std::nullopt;
  if (*token == '\0') {
    throw ConfigError("environment variable PARATRAIN_JOB_TOKEN is set but empty; unset it (no authentication) or "
                      "set the job's secret on every rank (paratrain launch generates one when it is unset)");
  }
  return std::string(token);
}

struct StoreEndpoint {
  std::string bind;     // where rank 0 listens
  std::string connect;  // where every rank (rank 0 too) connects
};

StoreEndpoint store_endpoint(const WorldInfo& world) {
  const bool one_host = world.local_world_size == world.world_size && is_local_address(world.master_addr);
  if (auto chosen = env::get("PARATRAIN_STORE_BIND")) {
    const bool wildcard = *chosen == "0.0.0.0" || *chosen == "::";
    return {*chosen, one_host && !wildcard ? *chosen : world.master_addr};
  }
  // A one-host job never needs the network, whatever MASTER_ADDR names (this
  // host's name may resolve to 127.0.1.1 or to a public address).
  if (one_host) return {"127.0.0.1", "127.0.0.1"};
  return {world.master_addr, world.master_addr};
}

c10::intrusive_ptr<c10d::Store> connect_auth_store(const WorldInfo& world, const InitOptions& options,
                                                   const std::string& token, std::string& where) {
  const StoreEndpoint ep = store_endpoint(world);
  where = fmt::format("authenticated store at {}:{}", ep.connect, world.master_port);
  auto with_rank = [&](const std::exception& e) { return fmt::format("rank {}: {}", world.rank, e.what()); };
  try {
    std::shared_ptr<auth::StoreServer> server;
    // Under an agent store the launcher serves it (launch/agent_store.h), for
    // every generation: rank 0 is a client like the others.
    if (world.rank == 0 && !world.use_agent_store) {
      auth::StoreServerOptions so;
      so.bind_address = ep.bind;
      so.port = world.master_port;
      so.token = token;
      so.job_id = world.run_id;
      server = std::make_shared<auth::StoreServer>(std::move(so));
      spdlog::info("rendezvous: store on {} admits only processes that know this job's token "
                   "(PARATRAIN_JOB_TOKEN, job id '{}')",
                   server->where(), world.run_id);
    }
    auth::AuthStoreOptions co;
    co.host = ep.connect;
    co.port = world.master_port;
    co.token = token;
    co.job_id = world.run_id;
    co.timeout = options.timeout;
    auto store = c10::make_intrusive<auth::AuthStore>(std::move(co));
    store->hold(server);
    return store;
  } catch (const TimeoutError& e) {
    throw TimeoutError(with_rank(e));
  } catch (const ConfigError& e) {
    throw ConfigError(with_rank(e));
  } catch (const CommError& e) {
    throw CommError(with_rank(e));
  }
}

// Note [Whose store is this]
// Two jobs that happen to share MASTER_PORT on one host (hand-started, or
// Slurm jobs given the same port) meet in one plain TCPStore: the second
// job's rank 0 cannot serve it, and its other ranks would check in with the
// first job's ranks and fail far from the cause. Rank 0 writes its job's id
// (TORCHELASTIC_RUN_ID, or "slurm-<SLURM_JOB_ID>") into the store; every
// other rank reads it before writing anything and refuses a store of
// another job by name. Jobs without any id ("none") cannot be told apart.
void check_store_owner(c10d::Store& store, const WorldInfo& world, bool serving, const std::string& where) {
  static const std::string kOwner = "paratrain/store_owner";
  if (serving) {
    const std::string id = world.run_id;
    store.set(kOwner, std::vector<uint8_t>(id.begin(), id.end()));
    return;
  }
  const auto got = store.get(kOwner);
  const std::string owner(got.begin(), got.end());
  if (owner != world.run_id)
    throw ConfigError(fmt::format("rank {} of job '{}' reached the {}, which is job '{}''s: two jobs share "
                                  "MASTER_PORT {} on this host. Give each job its own MASTER_PORT (under Slurm, "
                                  "leave it unset: each job then takes 15000 + its id's last four digits)",
                                  world.rank, world.run_id, where, owner, world.master_port));
}

c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world, const InitOptions& options,
                                              std::string& where) {
  if (auto token = job_token()) {
    const bool ours = !world.use_agent_store || world.agent_store_authenticated;
    if (ours && auth::available()) return connect_auth_store(world, options, *token, where);
    if (world.rank == 0) {
      spdlog::warn("rendezvous: PARATRAIN_JOB_TOKEN is set but {}: using c10d's unauthenticated TCPStore",
                   world.use_agent_store ? "the agent serves a TCPStore (TORCHELASTIC_USE_AGENT_STORE)"
                                         : "this paratrain was built without libsodium (install libsodium-dev "
                                           "and rebuild for the authenticated store)");
    }
  } else if (world.rank == 0 && !world.use_agent_store) {
    spdlog::info("rendezvous: no PARATRAIN_JOB_TOKEN: c10d's TCPStore on *:{} admits any process that reaches "
                 "the port (paratrain launch sets a token; see docs/launchers.md)",
                 world.master_port);
  }
  c10d::TCPStoreOptions store_opts;
  store_opts.port = static_cast<std::uint16_t>(world.master_port);
  store_opts.isServer = world.rank == 0 && !world.use_agent_store;
  store_opts.numWorkers = world.world_size;
  // We check arrival ourselves (check_in) so the error can name the missing
  // ranks; the store's own wait would only say "timed out".
  store_opts.waitWorkers = false;
  store_opts.timeout = options.timeout;
  // A hand-started rank without the token may be meeting a job's
  // authenticated store: ask before c10d's client reads its greeting (Note
  // [Probing for the greeting] in auth_store/store.cpp). Agent stores are
  // known: ours says PARATRAIN_AGENT_STORE, torchrun's is a TCPStore.
  if (!store_opts.isServer && !world.use_agent_store) {
    constexpr auto kGreetWithin = std::chrono::seconds(1);
    std::string why;
    const auto greeting = auth::probe_greeting(world.master_addr, world.master_port, options.timeout,
                                               std::min<std::chrono::milliseconds>(options.timeout, kGreetWithin), why);
    if (greeting == auth::Greeting::authenticated) {
      throw CommError(fmt::format(
          "rank {}: the store at {}:{} refused this process: it is a paratrain job's authenticated store, which "
          "admits only processes that know the job's token, and PARATRAIN_JOB_TOKEN is not set here. Start the "
          "ranks with `paratrain launch` (it hands them the token), export that job's PARATRAIN_JOB_TOKEN, or "
          "launch the job with --plain-store to admit processes without a token",
          world.rank, world.master_addr, world.master_port));
    }
    if (greeting == auth::Greeting::unreachable) {
      throw TimeoutError(fmt::format("rank {}: could not reach the {} within {} s: {}. Rank 0 (which serves the "
                                     "store) never arrived or the address is wrong",
                                     world.rank, where, std::chrono::duration<double>(options.timeout).count(),
                                     why));
    }
  }
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store_opts);
    if (!world.use_agent_store) check_store_owner(*store, world, store_opts.isServer, where);
    return store;
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    if (world.use_agent_store) {
      throw TimeoutError(fmt::format("rank {}: could not reach torchrun's agent store ({}; "
                                     "TORCHELASTIC_USE_AGENT_STORE is set) within {} s: {}. Is this process "
                                     "running under torchrun, with its MASTER_ADDR/MASTER_PORT?",
                                     world.rank, where, std::chrono::duration<double>(options.timeout).count(),
                                     msg));
    }
    if (world.rank == 0) {
      throw CommError(fmt::format("rank 0: could not serve the {}: {}. Is the port already in use? "
                                  "Pick another MASTER_PORT", where, msg));
    }
    throw TimeoutError(fmt::format("rank {}: could not reach the {} within {} s: {}. Rank 0 (which "
                                   "serves the store) never arrived or the address is wrong",
                                   world.rank, where,
                                   std::chrono::duration<double>(options.timeout).count(), msg));
  }
}

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
  out.group = with_recorder(backend_group(world, gloo_only, &parts), world, options);
  RejoinOptions rejoin;
  rejoin.window = rejoin_window;
  rejoin.gloo = parts.gloo;
  out.rejoiner = std::make_shared<Rejoiner>(parts.job_store, "elastic", rejoin);
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

  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", job_store);
  if (backend == "shm") {
    check_one_host(*job_store, world);
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
  if (elastic != nullptr) *elastic = ElasticParts{job_store, gloo};
  if (backend == "nccl") {
    // The host group carries CPU tensors, barriers and tagged send/recv
    // (Note [NCCL beside a host group], comm/nccl/nccl_group.cpp).
    StagingOptions staging;
    staging.timeout = options.timeout;
    staging.overlap = staging_overlap();
    NcclOptions nccl;
    nccl.timeout = options.timeout;
    nccl.device_index = world.local_rank % std::max(1, gpus_on_this_host());
    return make_nccl_group(c10::make_intrusive<c10d::PrefixStore>("nccl", job_store), world.rank, world.world_size,
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
      auto node_store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("node{}", layout.node), job_store);
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

// Who am I and how many are we, from the environment of torchrun / paratrain
// launch, OpenMPI or Slurm (world_from_env in rendezvous.h). Only parsing
// and checks: meeting the other ranks is rendezvous.cpp's.
#include <cctype>

#include <fmt/format.h>

#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

// Note [Bounds on the environment]
// Every count and index read from the environment is checked against its
// range before it becomes an int: WORLD_SIZE=4294967298 used to wrap to 2
// (a job of 2 that the user never asked for), and sizes in the billions made
// the check-in allocate gigabytes. kMaxWorldSize is far above any job this
// library runs (each rank is a process meeting one store) and small enough
// that per-rank bookkeeping (a vector of ints) stays a few megabytes.
constexpr long kMaxWorldSize = 1L << 20;

// The first host of a Slurm node list: "node[01-04],gpu7" -> "node01".
std::string first_slurm_host(const std::string& list) {
  auto bracket = list.find('[');
  auto comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return list.substr(0, comma);
  }
  std::string prefix = list.substr(0, bracket);
  std::string rest = list.substr(bracket + 1);
  auto end = rest.find_first_of("-,]");
  return prefix + rest.substr(0, end);
}

// SLURM_NTASKS_PER_NODE reads "4", "4(x2)" (4 on each of 2 nodes) or "2,1"
// (per node, heterogeneous); the leading count is this job's tasks per node
// on the first nodes. Anything else is named, not passed to a bare stoi.
int slurm_tasks_per_node(const std::string& value) {
  std::size_t digits = 0;
  while (digits < value.size() && std::isdigit(static_cast<unsigned char>(value[digits]))) ++digits;
  const bool rest_ok = digits == value.size() || value[digits] == '(' || value[digits] == ',';
  if (digits == 0 || digits > 6 || !rest_ok) {
    throw ConfigError(fmt::format("environment variable SLURM_NTASKS_PER_NODE='{}' is not a task count such as "
                                  "4, 4(x2) or 2,1; unset it or run under srun, which sets it",
                                  value.substr(0, 40)));
  }
  return std::stoi(value.substr(0, digits));
}

// TORCHELASTIC_USE_AGENT_STORE: torchrun writes "True" or "False".
bool agent_store_flag() {
  const auto v = env::get_or("TORCHELASTIC_USE_AGENT_STORE", "");
  if (v.empty() || v == "False" || v == "false" || v == "0") return false;
  if (v == "True" || v == "true" || v == "1") return true;
  throw ConfigError(fmt::format("environment variable TORCHELASTIC_USE_AGENT_STORE='{}' is not True or False "
                                "(torchrun sets it); unset it or set True/False",
                                v.substr(0, 40)));
}

// PARATRAIN_AGENT_STORE: which store `paratrain launch`'s agent serves.
bool agent_store_authenticated() {
  const auto v = env::get_or("PARATRAIN_AGENT_STORE", "");
  if (v.empty() || v == "tcp") return false;
  if (v == "auth") return true;
  throw ConfigError(fmt::format("environment variable PARATRAIN_AGENT_STORE='{}' is not auth or tcp (paratrain "
                                "launch sets it); unset it",
                                v.substr(0, 40)));
}

// The four numbers of one launcher's variables, each checked against the
// ones read before it (sizes first, so a rank's range is known).
struct RankVariables {
  const char* size;
  const char* rank;
  const char* local_size;
  const char* local_rank;
};

void read_ranks(WorldInfo& w, const RankVariables& v, bool local_defaults_to_world) {
  w.world_size = env::get_int_in_or(v.size, 1, kMaxWorldSize, "the number of ranks in the job", 1);
  w.rank = env::get_int_in_or(v.rank, 0, w.world_size - 1,
                              fmt::format("this process's rank, below {}={}", v.size, w.world_size), 0);
  if (v.local_size != nullptr) {
    w.local_world_size = env::get_int_in_or(v.local_size, 1, w.world_size,
                                            fmt::format("ranks on this host, at most {}={}", v.size, w.world_size),
                                            local_defaults_to_world ? w.world_size : 1);
  }
  const int local_fallback = local_defaults_to_world ? w.rank : 0;
  w.local_rank = env::get_int_in_or(v.local_rank, 0, kMaxWorldSize - 1, "this process's rank on its host",
                                    local_fallback);
}

}  // namespace

void validate_world(const WorldInfo& w) {
  auto bad = [&](const std::string& what) {
    throw ConfigError(fmt::format(
        "inconsistent distributed environment (from {}): {} [rank={} world_size={} local_rank={} "
        "local_world_size={} master={}:{}]",
        w.source, what, w.rank, w.world_size, w.local_rank, w.local_world_size, w.master_addr, w.master_port));
  };
  if (w.world_size < 1) bad("world_size must be >= 1");
  if (w.rank < 0 || w.rank >= w.world_size) bad("rank must be in [0, world_size)");
  if (w.local_world_size < 1 || w.local_world_size > w.world_size) bad("local_world_size must be in [1, world_size]");
  if (w.local_rank < 0 || w.local_rank >= w.local_world_size) bad("local_rank must be in [0, local_world_size)");
  if (w.master_port < 1 || w.master_port > 65535) bad("master port must be in [1, 65535]");
}

WorldInfo world_from_env() {
  WorldInfo w;
  w.master_port = env::get_int_in_or("MASTER_PORT", 1, 65535, "the TCP port of the rendezvous store", 29500);
  w.master_addr = env::get_or("MASTER_ADDR", "127.0.0.1");
  if (env::get("MASTER_ADDR")) w.master_addr_source = "MASTER_ADDR";
  w.restart_count = env::get_int_in_or("TORCHELASTIC_RESTART_COUNT", 0, 1000000, "a restart count", 0);
  w.run_id = env::get_or("TORCHELASTIC_RUN_ID", "none");
  if (w.run_id.empty()) w.run_id = "none";
  w.use_agent_store = agent_store_flag();
  w.agent_store_authenticated = w.use_agent_store && agent_store_authenticated();
  if (env::get("RANK") || env::get("WORLD_SIZE")) {
    w.source = "torchrun";
    read_ranks(w, {"WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK"}, true);
  } else if (env::get("OMPI_COMM_WORLD_RANK")) {
    w.source = "openmpi";
    read_ranks(w, {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK"},
               false);
  } else if (env::get("SLURM_PROCID")) {
    w.source = "slurm";
    read_ranks(w, {"SLURM_NTASKS", "SLURM_PROCID", nullptr, "SLURM_LOCALID"}, false);
    auto per_node = env::get_or("SLURM_NTASKS_PER_NODE", "");
    w.local_world_size = per_node.empty() ? w.world_size : slurm_tasks_per_node(per_node);
    // Note [A store port per Slurm job]
    // Two jobs packed onto one node must not both serve their store on
    // 29500: the second would fail ("Address already in use") and its ranks
    // could reach the first job's store. Without MASTER_PORT, a Slurm job
    // takes 15000 + the job id's last four digits, as Lightning does, so
    // jobs that run at once on a node get different ports (ids 10000 apart
    // would collide; set MASTER_PORT then).
    // The job's id names its rendezvous keys and its store (Note [Whose store
    // is this] in rendezvous.cpp) when no torchelastic id does.
    if (const auto job = env::get("SLURM_JOB_ID"); job && !job->empty() && !env::get("TORCHELASTIC_RUN_ID"))
      w.run_id = "slurm-" + *job;
    if (!env::get("MASTER_PORT")) {
      if (const auto job = env::get("SLURM_JOB_ID"); job && !job->empty() &&
                                                      job->find_first_not_of("0123456789") == std::string::npos) {
        w.master_port = 15000 + static_cast<int>(std::stoll(job->substr(job->size() > 4 ? job->size() - 4 : 0)));
      }
    }
    if (!env::get("MASTER_ADDR")) {
      if (auto nodes = env::get("SLURM_JOB_NODELIST")) {
        w.master_addr = first_slurm_host(*nodes);
        w.master_addr_source = fmt::format("the first host of SLURM_JOB_NODELIST='{}'", *nodes);
        if (w.master_addr.empty()) {
          throw ConfigError(fmt::format("environment variable SLURM_JOB_NODELIST='{}' names no first host; run "
                                        "under srun/sbatch, which set it, or set MASTER_ADDR",
                                        nodes->substr(0, 40)));
        }
      }
    }
  }
  validate_world(w);
  return w;
}

}  // namespace paratrain::comm

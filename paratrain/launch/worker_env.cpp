// Worker environment and program lookup for the launcher.
#include "paratrain/launch/worker_env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::launch {
namespace {

std::string_view key_of(std::string_view entry) {
  return entry.substr(0, entry.find('='));
}

bool base_has(const char* const* base, std::string_view key) {
  for (auto p = base; p != nullptr && *p != nullptr; ++p) {
    if (key_of(*p) == key) return true;
  }
  return false;
}

// Why `path` cannot be exec'd, or "" when it can.
std::string unusable_reason(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (access(path.c_str(), X_OK) != 0) return "is not executable (chmod +x it?)";
  return "";
}

}  // namespace

std::vector<std::string> worker_environment(const LaunchOptions& o, int local_rank,
                                            const char* const* base) {
  const int world_size = o.nproc_per_node * o.nnodes;
  std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"NODE_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      // torchelastic's restart environment: `paratrain train` resumes when
      // the count is > 0, and keys its rendezvous by run id and generation.
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(o.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.rdzv_id.empty() ? std::string("none") : o.rdzv_id},
      // Who forwards signals to the workers: a repeat of a preemption signal
      // from it is its copy of the same request (Note [A signal that
      // insists], train/run/preemption.cpp).
      {"PARATRAIN_LAUNCHER_PID", std::to_string(::getpid())},
  };
  if (!o.launch_id.empty()) vars.emplace_back("PARATRAIN_LAUNCH_ID", o.launch_id);
  if (!o.job_token.empty()) vars.emplace_back("PARATRAIN_JOB_TOKEN", o.job_token);
  if (o.num_servers > 0) vars.emplace_back("PARATRAIN_PS_SERVERS", std::to_string(o.num_servers));
  if (!o.backend.empty()) vars.emplace_back("PARATRAIN_BACKEND", o.backend);
  if (!o.heartbeat_dir.empty()) vars.emplace_back("PARATRAIN_HEARTBEAT_DIR", o.heartbeat_dir);
  if (!o.agent_store.empty()) {
    // The launcher serves the store (agent_store.h); workers are its clients.
    vars.emplace_back("TORCHELASTIC_USE_AGENT_STORE", "True");
    vars.emplace_back("PARATRAIN_AGENT_STORE", o.agent_store);
  }
  if (o.nproc_per_node > 1) {
    for (const char* key : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
      if (!base_has(base, key)) vars.emplace_back(key, "1");
    }
  }

  std::vector<std::string> env;
  for (auto p = base; p != nullptr && *p != nullptr; ++p) {
    const std::string_view key = key_of(*p);
    // Set by a torchrun around this launcher: it would make our workers look
    // for torchrun's agent store, but here our agent (or rank 0) serves it.
    if (key == "TORCHELASTIC_USE_AGENT_STORE" || key == "PARATRAIN_AGENT_STORE") continue;
    // A plain store has no token: an inherited one would make paratrain
    // workers attempt the authenticated handshake against it.
    if (o.plain_store && key == "PARATRAIN_JOB_TOKEN") continue;
    bool replaced = false;
    for (const auto& [name, value] : vars) replaced = replaced || key == name;
    if (!replaced) env.emplace_back(*p);
  }
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

std::string resolve_program(const std::string& name, const char* path_env) {
  if (name.empty()) {
    throw ConfigError("the program to launch is an empty string; put the program after `--`");
  }
  if (name.find('/') != std::string::npos) {
    const std::string why = unusable_reason(name);
    if (!why.empty()) {
      throw ConfigError(fmt::format("cannot launch '{}': {}", name, why));
    }
    return name;
  }
  const std::string path = path_env != nullptr ? path_env : "";
  std::string first_problem;
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > begin ? path.substr(begin, end - begin) : std::string(".");
    const std::string candidate = dir + "/" + name;
    const std::string why = unusable_reason(candidate);
    if (why.empty()) return candidate;
    // Remember a match that exists but cannot run: it explains the failure
    // better than "not found".
    if (first_problem.empty() && access(candidate.c_str(), F_OK) == 0) {
      first_problem = fmt::format(" ('{}' {})", candidate, why);
    }
    begin = end + 1;
  }
  throw ConfigError(fmt::format(
      "cannot launch '{}': no executable of that name on PATH{} [PATH={}]; give a path "
      "(./{} for one in the current directory) or fix PATH",
      name, first_problem, path, name));
}

}  // namespace paratrain::launch

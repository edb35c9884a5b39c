// launch(): validates and resolves the options, then hands the workers to the
// Supervisor. The CLI (apps/paratrain/launch_command.cpp) only maps flags here.
#include "paratrain/launch/launcher.h"

#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/store_checkin.h"
#include "paratrain/core/error.h"
#include "paratrain/core/remove_tree.h"
#include "paratrain/launch/agent_store.h"
#include "paratrain/launch/elastic_agent.h"
#include "paratrain/launch/free_port.h"
#include "paratrain/launch/line_prefixer.h"
#include "paratrain/launch/report.h"
#include "paratrain/launch/signal_capture.h"
#include "paratrain/launch/supervisor.h"
#include "paratrain/launch/worker_env.h"

namespace paratrain::launch {

namespace {

// Note [Local rank limits]
// Every worker is a process, and with prefixed output the launcher holds two
// pipe read ends per worker for the whole run (and briefly four while
// spawning it). Asking for more workers than the machine allows used to fork
// until pipe() or fork() failed mid-start; these checks refuse before the
// first fork and say which limit and why. kMaxLocalRanks bounds the poll set
// and catches a typo (an extra digit) even where the rlimits are unlimited.
constexpr int kMaxLocalRanks = 4096;
constexpr int kFdsPerWorker = 2;     // stdout and stderr pipes, read ends kept
constexpr int kLauncherFds = 64;     // stdio, the signal pipe, spawn's error pipe, headroom

void check_process_limits(const LaunchOptions& o) {
  auto bad = [](const std::string& what) { throw ConfigError("paratrain launch: " + what); };
  if (o.nproc_per_node > kMaxLocalRanks) {
    bad(fmt::format("--nproc-per-node {} is more than the {} worker processes one launcher starts on a "
                    "node; use more nodes (--nnodes) or fewer ranks per node",
                    o.nproc_per_node, kMaxLocalRanks));
  }
  rlimit files{};
  if (o.prefix_output && getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    const long long need = static_cast<long long>(o.nproc_per_node) * kFdsPerWorker + kLauncherFds;
    if (need > static_cast<long long>(files.rlim_cur)) {
      bad(fmt::format("--nproc-per-node {} needs about {} open files ({} output pipes per worker plus {} for "
                      "the launcher), but this process may open {} (RLIMIT_NOFILE, `ulimit -n`); raise "
                      "`ulimit -n` (hard limit {}), start fewer ranks, or pass --no-prefix (no pipes)",
                      o.nproc_per_node, need, kFdsPerWorker, kLauncherFds,
                      static_cast<long long>(files.rlim_cur),
                      files.rlim_max == RLIM_INFINITY ? std::string("unlimited")
                                                      : std::to_string(files.rlim_max)));
    }
  }
  rlimit procs{};
  if (getrlimit(RLIMIT_NPROC, &procs) == 0 && procs.rlim_cur != RLIM_INFINITY &&
      static_cast<unsigned long long>(o.nproc_per_node) >= procs.rlim_cur) {
    bad(fmt::format("--nproc-per-node {} worker processes would reach this user's process limit {} "
                    "(RLIMIT_NPROC, `ulimit -u`, which counts every process the user already runs); "
                    "raise `ulimit -u` or start fewer ranks",
                    o.nproc_per_node, static_cast<long long>(procs.rlim_cur)));
  }
}

// The job id when the user named one (the same on every node); else unique
// enough to tell this launch's run version from any other's: host, pid and
// the start time in milliseconds.
std::string make_launch_id(const std::string& rdzv_id) {
  if (!rdzv_id.empty()) return rdzv_id;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return fmt::format("{}-{}-{}", host, static_cast<long long>(getpid()), static_cast<long long>(ms));
}

// A fresh job token: 32 bytes from the kernel's CSPRNG, as hex (it travels
// in an environment variable).
std::string make_job_token() {
  unsigned char bytes[32];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("paratrain launch: could not draw a job token from the kernel (getrandom: {}); "
                              "set PARATRAIN_JOB_TOKEN yourself", std::strerror(errno)));
    }
    got += static_cast<std::size_t>(n);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

// A folder for this launch's heartbeat files (heartbeat_monitor.h), one
// sub-folder per generation so a new generation never reads the last beats of
// the old one; removed when the launch ends. Empty when it cannot be made
// (then the workers get no PARATRAIN_HEARTBEAT_DIR and the launcher watches
// exits only, as before heartbeats).
class HeartbeatDir {
 public:
  HeartbeatDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/paratrain-heartbeats-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) root_ = pattern;
  }
  ~HeartbeatDir() {
    std::error_code ec;
    if (!root_.empty()) core::remove_tree(root_, ec);
  }
  HeartbeatDir(const HeartbeatDir&) = delete;
  HeartbeatDir& operator=(const HeartbeatDir&) = delete;
  bool ok() const { return !root_.empty(); }
  std::string generation(int k) const {
    if (root_.empty()) return {};
    const auto dir = root_ / ("gen" + std::to_string(k));
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    return ec ? std::string() : dir.string();
  }

 private:
  std::filesystem::path root_;
};

// A rank died under --keep-going: the others go on, but none of them can
// meet it in this generation's check-in any more, so they are told now
// instead of after world.timeout_s (Note [Ending a check-in] in
// comm/store_checkin.cpp). Inert for ranks past the check-in. Best effort:
// a store that cannot be reached leaves the others to their timeout.
void end_check_in(const LaunchOptions& o, const std::string& store_host, const WorkerOutcome& dead) {
  try {
    AgentStoreClientOptions co;
    co.host = store_host;
    co.port = o.master_port;
    co.token = o.job_token;
    co.job_id = o.rdzv_id.empty() ? std::string("none") : o.rdzv_id;
    co.kind = agent_store_kind(o.job_token);
    co.timeout = std::chrono::seconds(5);
    comm::end_check_in(connect_agent_store(co), co.job_id, o.restart_count,
                       fmt::format("the launcher saw a peer fail: {}", describe(dead)));
  } catch (const std::exception& e) {
    write_all(o.err_fd, fmt::format("paratrain launch: could not tell the other ranks that rank {} is gone ({}); "
                                    "any still meeting it wait up to world.timeout_s\n",
                                    dead.rank, e.what()));
  }
}

}  // namespace

int launch(const LaunchOptions& options) {
  return launch_with_report(options).exit_code;
}

// Note [Restarting workers]
// Restarts are torchelastic's: on a worker failure every local worker is
// stopped (as for fail-fast) and, while restarts remain, all of them are
// started again as generation k (TORCHELASTIC_RESTART_COUNT=k). Three things
// make the new generation safe and continue the same run:
// - the launcher returns from a generation only when every worker and its
//   process group are gone, so no stale worker survives into the next one;
// - workers prefix every store key with the run id and the generation
//   (comm/rendezvous.cpp), so a stale process that still reached the store
//   (another node's, or an agent store reused across generations) could not
//   be counted in the new check-in;
// - every generation gets the same PARATRAIN_LAUNCH_ID; `paratrain train`
//   records it in the run version's run.json, and with
//   TORCHELASTIC_RESTART_COUNT > 0 continues that version with
//   train.resume = "auto" (train/recovery/restart_resume.h): the newest checkpoint
//   that has its index.json. A save interrupted by the failure has none and
//   is never loaded.
// The store is the agent's (node 0's launcher serves it for the whole launch,
// agent_store.h), so every generation meets at the same port.
LaunchReport launch_with_report(const LaunchOptions& options) {
  validate(options);
  // Only the exec path is resolved; argv[0] stays as the user wrote it.
  const std::string program = resolve_program(options.command[0], std::getenv("PATH"));
  LaunchOptions resolved = options;
  if (resolved.master_addr.empty()) resolved.master_addr = "127.0.0.1";
  if (resolved.master_port == 0) resolved.master_port = find_free_port();
  if (resolved.nnodes_min == 0) resolved.nnodes_min = resolved.nnodes_max = resolved.nnodes;
  if (resolved.launch_id.empty()) resolved.launch_id = make_launch_id(resolved.rdzv_id);
  auto say = [&](const std::string& line) { write_all(options.err_fd, line + "\n"); };
  // The job token (comm/rendezvous.cpp): the user's, else a fresh one when
  // this node is the whole job. Nodes cannot agree on a generated one.
  if (resolved.plain_store) {
    resolved.job_token.clear();
  } else if (resolved.job_token.empty()) {
    if (const char* token = std::getenv("PARATRAIN_JOB_TOKEN"); token != nullptr && *token != '\0') {
      resolved.job_token = token;
    } else if (resolved.nnodes == 1 && !resolved.multi_agent) {
      resolved.job_token = make_job_token();
    } else {
      say(fmt::format("paratrain launch: --nnodes {} without PARATRAIN_JOB_TOKEN: the rendezvous store admits any "
                      "process that reaches port {}; export the same secret as PARATRAIN_JOB_TOKEN on every node "
                      "(e.g. `openssl rand -hex 32`) to admit only this job's",
                      resolved.multi_agent ? fmt::format("{}:{}", resolved.nnodes_min, resolved.nnodes_max)
                                           : std::to_string(resolved.nnodes),
                      resolved.master_port));
    }
  }
  if (resolved.nnodes_min != resolved.nnodes_max && !resolved.multi_agent) {
    say(fmt::format("paratrain launch: --nnodes {}:{} without --rdzv-endpoint: no other agent can find this one; "
                    "this node runs the job alone with its {} rank{} (give --rdzv-endpoint HOST:PORT and --rdzv-id "
                    "on every node to let nodes join and leave)",
                    resolved.nnodes_min, resolved.nnodes_max, resolved.nproc_per_node,
                    resolved.nproc_per_node == 1 ? "" : "s"));
  }

  // Capture signals before the first worker starts: a Ctrl-C during start-up
  // must reach the workers already running, not kill the launcher alone.
  SignalCapture signals;
  HeartbeatDir heartbeats;
  if (!heartbeats.ok()) say("paratrain launch: cannot create a folder for heartbeats under $TMPDIR or /tmp; a stopped worker will go unnoticed until its peers time out");
  if (resolved.multi_agent) {
    return run_multi_agent(resolved, program, signals, [&](int k) { return heartbeats.generation(k); });
  }
  // The agent store: node 0's launcher serves the job's store for every
  // generation (workers are its clients), so a worker's death, rank 0's
  // included, never takes the store down. Its port stays for the launch.
  resolved.agent_store = agent_store_name(agent_store_kind(resolved.job_token));
  std::unique_ptr<AgentStore> store;
  // Where this launcher reaches the agent store: the address it listens on
  // (a wildcard through loopback) on node 0, else node 0's.
  std::string store_host = resolved.master_addr;
  if (resolved.node_rank == 0) {
    AgentStoreOptions so;
    const char* bind = std::getenv("PARATRAIN_STORE_BIND");
    so.bind_address = bind != nullptr && *bind != '\0' ? bind
                      : resolved.nnodes == 1               ? std::string("127.0.0.1")
                                                           : resolved.master_addr;
    so.port = resolved.master_port;
    so.token = resolved.job_token;
    so.job_id = resolved.rdzv_id.empty() ? std::string("none") : resolved.rdzv_id;
    store = std::make_unique<AgentStore>(so);
    store_host = so.bind_address == "0.0.0.0" || so.bind_address == "::" ? "127.0.0.1" : so.bind_address;
  }

  std::vector<WorkerOutcome> failures;
  for (int generation = 0;; ++generation) {
    resolved.restart_count = generation;
    resolved.heartbeat_dir = heartbeats.generation(generation);
    LaunchReport report;
    {
      Supervisor supervisor(resolved, program, signals);
      if (resolved.keep_going) {
        supervisor.set_on_tolerated([&](const WorkerOutcome& dead) { end_check_in(resolved, store_host, dead); });
      }
      supervisor.start();
      report = supervisor.run();
    }
    report.restarts = generation;
    report.failures = failures;
    const bool restart = report.exit_code != 0 && report.received_signal == 0 && report.first_failed >= 0 &&
                         generation < options.max_restarts;
    if (!restart) {
      if (generation > 0) {
        report.summary += fmt::format(" (after {} restart{})", generation, generation == 1 ? "" : "s");
      }
      say(report.summary);
      return report;
    }
    const WorkerOutcome& cause = report.workers[static_cast<std::size_t>(report.first_failed)];
    failures.push_back(cause);
    say(fmt::format("paratrain launch: generation {} failed: {}; restart {} of {}: starting {} again with "
                    "TORCHELASTIC_RESTART_COUNT={} (`paratrain train` resumes from its latest complete checkpoint)",
                    generation, describe(cause), generation + 1, options.max_restarts,
                    resolved.nproc_per_node == 1 ? "the worker" : fmt::format("all {} local workers", resolved.nproc_per_node),
                    generation + 1));
  }
}

void validate(const LaunchOptions& o) {
  auto bad = [](const std::string& what) { throw ConfigError("paratrain launch: " + what); };
  if (o.nproc_per_node < 1) bad(fmt::format("--nproc-per-node {} must be >= 1", o.nproc_per_node));
  if (o.nnodes < 1) bad(fmt::format("--nnodes {} must be >= 1", o.nnodes));
  if (o.nnodes_min != 0 || o.nnodes_max != 0) {
    if (o.nnodes_min < 1 || o.nnodes_max < o.nnodes_min) {
      bad(fmt::format("--nnodes {}:{} must have 1 <= MIN <= MAX", o.nnodes_min, o.nnodes_max));
    }
    // Elastic membership needs agents that meet and agree on who is in; until
    // then only MIN = 1 runs (this node alone), or a fixed size.
    if (o.nnodes_min != o.nnodes_max && o.nnodes_min > 1 && !o.multi_agent) {
      bad(fmt::format("--nnodes {}:{}: a job that waits for {} nodes and lets more join needs a multi-agent "
                      "rendezvous: give --rdzv-endpoint HOST:PORT and --rdzv-id on every node; or run a fixed "
                      "size (--nnodes {} with --master-addr/--master-port) or --nnodes 1:{} on one node",
                      o.nnodes_min, o.nnodes_max, o.nnodes_min, o.nnodes_min, o.nnodes_max));
    }
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    bad(fmt::format("--node-rank {} must be >= 0 and < --nnodes {}", o.node_rank, o.nnodes));
  }
  if (static_cast<long long>(o.nproc_per_node) * o.nnodes > INT_MAX) {
    bad(fmt::format("--nproc-per-node {} * --nnodes {} ranks is too many", o.nproc_per_node, o.nnodes));
  }
  if (o.num_servers < 0 || (o.num_servers > 0 && o.num_servers >= o.nproc_per_node * o.nnodes)) {
    bad(fmt::format("--num-servers {} must be >= 0 and leave at least one of the {} ranks a worker", o.num_servers,
                    o.nproc_per_node * o.nnodes));
  }
  check_process_limits(o);
  if (o.master_port < 0 || o.master_port > 65535) {
    bad(fmt::format("--master-port {} must be in 1..65535 (leave it out on a single node to pick a free one)",
                    o.master_port));
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    bad(fmt::format("--nnodes {} needs --master-port: a free port picked on one node cannot be known by "
                    "the others; pass the same --master-port to every node's launcher", o.nnodes));
  }
  if (o.nnodes > 1 && o.master_addr.empty()) {
    bad(fmt::format("--nnodes {} needs --master-addr: the address of node 0 (where rank 0 runs) that "
                    "every node can reach", o.nnodes));
  }
  if (o.backend == "mpi") {
    bad(fmt::format("--backend mpi: MPI ranks must be started by MPI's own launcher, which paratrain launch is "
                    "not. Run `mpirun -np {} paratrain train ...` instead (as root add --allow-run-as-root; on "
                    "a small machine --oversubscribe), or pick --backend gloo|shm|auto",
                    o.nproc_per_node * o.nnodes));
  }
  if (!o.backend.empty() && o.backend != "gloo" && o.backend != "shm" && o.backend != "hierarchical" &&
      o.backend != "nccl" && o.backend != "auto")
    bad(fmt::format("--backend '{}' is not a backend: use gloo, shm, hierarchical, nccl, auto (or mpirun for mpi)",
                    o.backend));
  if (o.backend == "shm" && o.nnodes > 1)
    bad(fmt::format("--backend shm needs every rank on one host, but --nnodes is {}; use --backend gloo or auto",
                    o.nnodes));
  if (o.max_restarts < 0) bad(fmt::format("--max-restarts {} must be >= 0", o.max_restarts));
  if (o.keep_going && o.max_restarts > 0)
    bad(fmt::format("--keep-going with --max-restarts {}: one lets the others run on after a failure, the other "
                    "restarts them all; pick one",
                    o.max_restarts));
  if (o.monitor_interval.count() <= 0) {
    bad(fmt::format("--monitor-interval {} s must be > 0 (e.g. 0.1)",
                    static_cast<double>(o.monitor_interval.count()) / 1000.0));
  }
  for (char c : o.rdzv_id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      bad(fmt::format("--rdzv-id '{}' may hold only letters, digits, '-', '_' and '.' (it becomes part of "
                      "every rendezvous key)", o.rdzv_id));
    }
  }
  if (o.multi_agent) {
    if (o.master_addr.empty() || o.master_port == 0)
      bad("--nnodes MIN:MAX with agents that meet needs --rdzv-endpoint HOST:PORT, the same on every node");
    if (o.keep_going) bad("--keep-going with --rdzv-endpoint: an elastic job re-rendezvouses after a failure; pick one");
    if (o.rdzv_timeout.count() <= 0 || o.rdzv_last_call.count() < 0 || o.rdzv_keep_alive_timeout.count() <= 0)
      bad(fmt::format("--rdzv-timeout {:g} s must be > 0, --rdzv-last-call {:g} s >= 0 and the keep-alive timeout "
                      "{:g} s > 0",
                      static_cast<double>(o.rdzv_timeout.count()) / 1000.0,
                      static_cast<double>(o.rdzv_last_call.count()) / 1000.0,
                      static_cast<double>(o.rdzv_keep_alive_timeout.count()) / 1000.0));
  }
  if (o.kill_grace.count() < 0) {
    bad(fmt::format("--kill-grace {} s must be >= 0", static_cast<double>(o.kill_grace.count()) / 1000.0));
  }
  if (o.out_fd < 0 || o.err_fd < 0) {
    bad(fmt::format("output fds must be open descriptors (out_fd {}, err_fd {})", o.out_fd, o.err_fd));
  }
  if (o.command.empty() || o.command[0].empty()) {
    bad("no program to launch: put it after `--`, e.g. paratrain launch --nproc-per-node 2 -- ./train "
        "--lr 0.1");
  }
}

}  // namespace paratrain::launch

// launch(): validates and resolves the options, then hands the workers to the
// Supervisor. The CLI (apps/paratrain/launch_command.cpp) only maps flags here.
#include "paratrain/launch/launcher.h"

#include <sys/resource.h>

#include <climits>
#include <cstdlib>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/launch/free_port.h"
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

}  // namespace

int launch(const LaunchOptions& options) {
  return launch_with_report(options).exit_code;
}

LaunchReport launch_with_report(const LaunchOptions& options) {
  validate(options);
  // Only the exec path is resolved; argv[0] stays as the user wrote it.
  std::string program = resolve_program(options.command[0], std::getenv("PATH"));
  LaunchOptions resolved = options;
  if (resolved.master_addr.empty()) resolved.master_addr = "127.0.0.1";
  if (resolved.master_port == 0) resolved.master_port = find_free_port();

  // Capture signals before the first worker starts: a Ctrl-C during start-up
  // must reach the workers already running, not kill the launcher alone.
  SignalCapture signals;
  Supervisor supervisor(resolved, std::move(program), signals);
  supervisor.start();
  return supervisor.run();
}

void validate(const LaunchOptions& o) {
  auto bad = [](const std::string& what) { throw ConfigError("paratrain launch: " + what); };
  if (o.nproc_per_node < 1) bad(fmt::format("--nproc-per-node {} must be >= 1", o.nproc_per_node));
  if (o.nnodes < 1) bad(fmt::format("--nnodes {} must be >= 1", o.nnodes));
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

// `paratrain launch`: maps the CLI flags onto paratrain::launch::LaunchOptions
// and runs launch(). Validation and every behaviour live in the library
// (paratrain/launch/launcher.h); this file only parses. Flags follow torchrun,
// whose underscore spellings (--nproc_per_node, ...) are accepted too.
#include <chrono>
#include <cmath>
#include <memory>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/paratrain/commands.h"
#include "paratrain/core/error.h"
#include "paratrain/launch/launcher.h"

namespace paratrain::cli {
namespace {

// A duration flag in seconds, checked as the user typed it: NaN, a
// negative value or one too large to be milliseconds (1e300) would
// otherwise be rounded into a number the launcher reports as something
// else ("--monitor-interval -0.001 s" for nan) or accepts (--rdzv-timeout
// -5 outside --nnodes MIN:MAX).
std::chrono::milliseconds seconds_flag(const char* flag, double s, bool zero_ok) {
  constexpr double kMaxSeconds = 7 * 24 * 3600;  // a week, as world.timeout_s
  const bool ok = std::isfinite(s) && s <= kMaxSeconds && (zero_ok ? s >= 0 : s >= 0.001);
  if (!ok)
    throw ConfigError(fmt::format("paratrain launch: {} {:g} s must be {} and at most {:g} (7 days)", flag, s,
                                  zero_ok ? ">= 0" : "> 0 (at least 0.001)", kMaxSeconds));
  return std::chrono::milliseconds(std::llround(s * 1000.0));
}

}  // namespace

Command add_launch_command(CLI::App& app) {
  struct Flags {
    launch::LaunchOptions options;
    double kill_grace_s = 5.0;
    double monitor_interval_s = 0.05;
    std::string nnodes = "1";
    std::string rdzv_endpoint;
    double rdzv_timeout_s = 600;
    double rdzv_last_call_s = 10;
    double rdzv_keep_alive_s = 15;
    bool no_prefix = false;
  };
  auto flags = std::make_shared<Flags>();
  auto& o = flags->options;

  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start worker processes with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...), "
      "prefix their output with the rank, and stop them all when one fails.\n"
      "  paratrain launch --nproc-per-node N [--max-restarts K] [--nnodes M --node-rank R --master-addr A "
      "--master-port P] -- PROGRAM ARGS...");
  sub->add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                  "worker processes (ranks) on this node")
      ->capture_default_str();
  sub->add_option("--nnodes", flags->nnodes,
                  "nodes in the job (each runs its own launcher): N, or MIN:MAX as torchrun has it (with "
                  "--rdzv-endpoint the agents meet there and nodes may fail, leave and join; without it, this "
                  "node alone)")
      ->capture_default_str();
  sub->add_option("--node-rank,--node_rank", o.node_rank, "this node's index in [0, nnodes)")
      ->capture_default_str();
  sub->add_option("--master-addr,--master_addr", o.master_addr,
                  "host of rank 0's store; default 127.0.0.1, required with --nnodes > 1");
  sub->add_option("--master-port,--master_port", o.master_port,
                  "port of rank 0's store; default: a free port (single node only)");
  sub->add_option("--num-servers,--num_servers", o.num_servers,
                  "parameter servers among the ranks (sets ps.servers for `paratrain train`; 0 = none)")
      ->capture_default_str();
  sub->add_option("--backend", o.backend,
                  "collective backend of the workers (sets world.backend through PARATRAIN_BACKEND; "
                  "--set world.backend=... wins): gloo, shm (shared memory, this host), hierarchical (several hosts: shm "
                  "inside each, gloo between), nccl (GPU tensors, one GPU per rank; CUDA builds) or auto. For mpi run "
                  "`mpirun -np N paratrain train ...` instead");
  sub->add_option("--max-restarts,--max_restarts", o.max_restarts,
                  "restart all local workers up to this many times when one fails; `paratrain train` then "
                  "resumes from the latest complete checkpoint (0 = fail fast)")
      ->capture_default_str();
  sub->add_option("--monitor-interval,--monitor_interval", flags->monitor_interval_s,
                  "seconds between checks of the workers for exits")
      ->capture_default_str();
  sub->add_option("--rdzv-endpoint,--rdzv_endpoint", flags->rdzv_endpoint,
                  "HOST[:PORT] of the rendezvous store (port 29400 if left out); the same as --master-addr "
                  "and --master-port");
  sub->add_option("--rdzv-id,--rdzv_id", o.rdzv_id,
                  "job id: workers get it as TORCHELASTIC_RUN_ID and it prefixes every rendezvous key");
  sub->add_option("--node-id,--node_id", o.node_id,
                  "this agent's name in the rendezvous (--nnodes MIN:MAX with --rdzv-endpoint); nodes are ranked "
                  "by it; default host-pid")
      ;
  sub->add_option("--rdzv-timeout,--rdzv_timeout", flags->rdzv_timeout_s,
                  "seconds the agents wait for MIN nodes before the launch fails (torchrun's --rdzv-conf "
                  "join_timeout)")
      ->capture_default_str();
  sub->add_option("--rdzv-last-call,--rdzv_last_call", flags->rdzv_last_call_s,
                  "once MIN nodes are in, seconds to wait for more (up to MAX) before a generation starts "
                  "(torchrun's --rdzv-conf last_call_timeout)")
      ->capture_default_str();
  sub->add_option("--rdzv-keep-alive-timeout", flags->rdzv_keep_alive_s,
                  "seconds without a keep-alive after which a node's agent counts as dead and the others "
                  "re-rendezvous without it")
      ->capture_default_str();
  sub->add_option("--kill-grace", flags->kill_grace_s,
                  "seconds stopped workers get between SIGTERM and SIGKILL")
      ->capture_default_str();
  sub->add_flag("--keep-going", o.keep_going,
                "a worker other than rank 0 that fails is reported and the others run on (for `paratrain "
                "federated`, which survives a client process dying, and `paratrain train` with "
                "elastic.in_job=true, whose survivors re-form the world); rank 0 failing still stops all");
  sub->add_flag("--keep-going-rank0", o.keep_going_rank0,
                "with --keep-going, rank 0 failing lets the others run on too (`paratrain train` with "
                "elastic.in_job=true: the survivors elect a new rank 0; the launcher serves the store)");
  sub->add_flag("--plain-store", o.plain_store,
                "serve c10d's plain TCPStore with no job token, as torchrun does, for workers that are not "
                "paratrain (a Python torch.distributed program); any process reaching the port may join");
  sub->add_flag("--no-prefix", flags->no_prefix,
                "let workers write to the terminal directly instead of prefixing lines with [rank]");
  sub->add_option("command", o.command, "the program to run on every rank and its arguments (after --)");
  sub->footer(
      "Put `--` before PROGRAM so that its own flags are not read as the launcher's. Each worker "
      "leads its own process group; the first worker that fails (or a SIGINT/SIGTERM/SIGHUP to the "
      "launcher) stops all of them: SIGTERM, then SIGKILL after --kill-grace seconds. The exit "
      "code is the first failing worker's (128 + signal when killed by one). With --max-restarts N "
      "the workers are instead started again, up to N times, as a new generation "
      "(TORCHELASTIC_RESTART_COUNT), and `paratrain train` resumes from its latest complete checkpoint.");

  auto run = [flags]() {
    launch::LaunchOptions options = flags->options;
    options.prefix_output = !flags->no_prefix;
    options.kill_grace = seconds_flag("--kill-grace", flags->kill_grace_s, /*zero_ok=*/true);
    options.monitor_interval = seconds_flag("--monitor-interval", flags->monitor_interval_s, false);
    std::tie(options.nnodes_min, options.nnodes_max) = launch::parse_nnodes(flags->nnodes);
    // The job runs on the nodes there are; with MIN:MAX that is MIN (see launcher.h).
    options.nnodes = options.nnodes_min;
    if (!flags->rdzv_endpoint.empty()) {
      if (!options.master_addr.empty() || options.master_port != 0) {
        throw ConfigError(fmt::format("paratrain launch: --rdzv-endpoint {} and --master-addr/--master-port "
                                      "name the same store; give one of them",
                                      flags->rdzv_endpoint));
      }
      std::tie(options.master_addr, options.master_port) = launch::parse_endpoint(flags->rdzv_endpoint);
      // The agents meet there and agree on each generation's nodes
      // (launch/agent_rendezvous.h); a fixed size keeps today's static path.
      options.multi_agent = options.nnodes_min != options.nnodes_max;
    }
    options.rdzv_timeout = seconds_flag("--rdzv-timeout", flags->rdzv_timeout_s, false);
    options.rdzv_last_call = seconds_flag("--rdzv-last-call", flags->rdzv_last_call_s, true);
    options.rdzv_keep_alive_timeout = seconds_flag("--rdzv-keep-alive-timeout", flags->rdzv_keep_alive_s, false);
    if (parse_only()) {  // PARATRAIN_PARSE_ONLY (commands.h): the options, not the workers
      launch::validate(options);
      return 0;
    }
    return launch::launch(options);
  };
  return Command{sub, run, /*checks_parse_only=*/true};
}

}  // namespace paratrain::cli

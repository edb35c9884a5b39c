// `paratrain launch`, like torchrun: starts nproc_per_node worker processes on
// this node with torchrun's environment, prefixes their output with the rank,
// and supervises them: the first failure, or a SIGINT/SIGTERM/SIGHUP to the
// launcher, stops every worker (SIGTERM, then SIGKILL). Without restarts the
// launch then fails; with max_restarts > 0 the launcher starts the workers
// again as a new generation (TORCHELASTIC_RESTART_COUNT), and `paratrain
// train` resumes from the run's latest complete checkpoint (Note [Restarting
// workers] in launcher.cpp). The launcher of node 0 (the agent) serves the
// job's store for the whole launch (agent_store.h); workers meet in it at
// MASTER_ADDR:MASTER_PORT (paratrain/comm/rendezvous.h), under keys that carry
// the generation. With --rdzv-endpoint and --nnodes MIN:MAX the agents of all
// nodes first meet in that store and agree on each generation's membership
// (agent_rendezvous.h, elastic_agent.cpp): nodes may fail, leave and join.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/core/exit_codes.h"

namespace paratrain::launch {

// Fields map one to one onto the CLI flags, and error messages name the flags.
struct LaunchOptions {
  // Which generation of workers this is (set by launch() for each restart;
  // workers see it as TORCHELASTIC_RESTART_COUNT). Callers leave it 0.
  int restart_count = 0;
  // Names this launch for every generation of its workers
  // (PARATRAIN_LAUNCH_ID): `paratrain train` records it in run.json and a
  // restarted worker finds its run version by it. launch() sets it to
  // rdzv_id, or host-pid-time when that is empty. Callers leave it empty.
  std::string launch_id;
  // Worker processes started on this node, one rank each. More ranks than
  // cores is allowed (tests do it) but the ranks then share the cores.
  int nproc_per_node = 1;
  // Nodes in the job, and this node's index in [0, nnodes). Every node runs
  // its own launcher with the same nnodes, master_addr and master_port; the
  // global rank is node_rank * nproc_per_node + local_rank.
  int nnodes = 1;
  int node_rank = 0;
  // Host where rank 0 serves the store. Empty means 127.0.0.1, which only a
  // single node can use: with nnodes > 1 it must be given (an address that
  // every node reaches), because the other nodes cannot guess it.
  std::string master_addr;
  // Port of that store. 0 picks a free port on this machine, single node only
  // (other nodes could not learn it). Picking races a little: the port is free
  // when checked and rank 0 binds it a moment later, as with torchrun; pass a
  // port explicitly on a busy machine.
  int master_port = 0;
  // The program and its arguments; a name without '/' is looked up on PATH.
  // Must exist and be executable, checked before any worker starts.
  std::vector<std::string> command;
  // How long stopped workers get between SIGTERM and SIGKILL. Longer lets them
  // flush logs or save a checkpoint; shorter surfaces failures sooner (a
  // failed launch ends at most this long plus ~1 s after the first failure).
  std::chrono::milliseconds kill_grace{5000};
  // Prefix every line of every worker's stdout and stderr with "[rank]: ".
  // Costs a pipe per stream and a copy through the launcher, and splits lines
  // longer than 64 KiB; false lets workers write to out_fd/err_fd directly,
  // where lines of different ranks may interleave mid-line.
  bool prefix_output = true;
  // Where worker output and the launcher's own messages go (stdout/stderr by
  // default). Embedders and tests redirect them; the launcher never closes them.
  int out_fd = 1;
  int err_fd = 2;
  // > 0: every worker gets PARATRAIN_PS_SERVERS=<n>, which `paratrain train`
  // reads as ps.servers (an explicit --set ps.servers wins): the last n
  // ranks become parameter servers. The launcher itself treats all ranks
  // alike.
  int num_servers = 0;
  // Non-empty: every worker gets PARATRAIN_BACKEND=<backend>, which
  // `paratrain train` (and `federated`, and paratrain::init_from_env) read as
  // world.backend (an explicit --set world.backend wins): "gloo", "shm", "hierarchical" or
  // "auto". "mpi" is refused: MPI ranks must be started by mpirun, which
  // knows them; the launcher's processes are not MPI's.
  std::string backend;
  // Restart-based elasticity (torchrun's --max-restarts): how many times the
  // workers are started again after one fails. 0 = fail fast. A restart
  // stops every local worker and starts all of them again; progress since the
  // last checkpoint is lost, so checkpoint often (train.checkpoint_every_steps).
  // A signal to the launcher (Ctrl-C) never restarts.
  int max_restarts = 0;
  // A worker other than global rank 0 that fails is reported and the others
  // keep running, for jobs whose rank 0 survives losing a peer (`paratrain
  // federated`: a client process that dies costs only its clients). Rank 0
  // failing still stops every worker. Such tolerated failures do not count
  // in the exit code while some rank succeeds; when none does, the launch
  // fails with the likeliest cause's code. A rank that dies before every
  // rank checked in ends the others' rendezvous at once (Note [Ending a
  // check-in] in comm/store_checkin.cpp): a world that cannot form is not
  // waited for. Not with max_restarts > 0 (a restart replaces every
  // worker, which is the opposite policy).
  bool keep_going = false;
  // With keep_going: rank 0 failing is tolerated too. For jobs whose
  // survivors elect a new rank 0 (`paratrain train` with elastic.in_job);
  // the store is the launcher's (agent_store.h), so it outlives rank 0.
  bool keep_going_rank0 = false;
  // Serve c10d's plain TCPStore without a job token, as torchrun does, so
  // workers that are not paratrain (a Python torch.distributed program) can
  // join it: our authenticated store refuses their TCPStore clients. Any
  // process that reaches the port may then join (single node: loopback only).
  bool plain_store = false;
  // How often the launcher checks its workers for exits (torchrun's
  // --monitor-interval). Output and signals wake it sooner; a shorter interval
  // notices a dead worker sooner at the cost of more wake-ups.
  std::chrono::milliseconds monitor_interval{50};
  // torchrun's --nnodes MIN:MAX. Only a fixed size runs today (nnodes_min ==
  // nnodes_max == nnodes), or MIN = 1 with no rendezvous endpoint: this node
  // alone, said so at start. 0 = not given (both equal nnodes).
  int nnodes_min = 0;
  int nnodes_max = 0;
  // The job's secret, passed to every worker as PARATRAIN_JOB_TOKEN: with it
  // rank 0's store admits only processes that know it (Note [Authenticated
  // rendezvous] in comm/rendezvous.cpp). launch() takes $PARATRAIN_JOB_TOKEN,
  // else generates one for a single-node job; a multi-node job needs the
  // same token on every node, so it must come from the environment. Never
  // printed. Callers leave it empty.
  std::string job_token;
  // torchrun's --rdzv-id: names the job; workers get it as TORCHELASTIC_RUN_ID
  // and every rendezvous key they write carries it, so two jobs that share a
  // store cannot mix. Empty = "none", torchrun's default.
  std::string rdzv_id;
  // Where workers write their heartbeat files (PARATRAIN_HEARTBEAT_DIR; see
  // heartbeat_monitor.h): launch() makes a fresh folder per generation and
  // removes it at the end. Callers leave it empty.
  std::string heartbeat_dir;
  // How long the launcher waits, after a rank went silent, for the other
  // ranks' hang-doctor dumps (asked for with SIGUSR1) before it stops them.
  std::chrono::milliseconds doctor_wait{3000};
  // Which store the agent serves ("auth" or "tcp", agent_store.h); workers
  // get TORCHELASTIC_USE_AGENT_STORE=True and PARATRAIN_AGENT_STORE=<this>.
  // Set by launch(); empty (callers, unit tests) = rank 0 serves, as before.
  std::string agent_store;

  // Multi-agent rendezvous (torchrun's c10d rendezvous; Note [Multi-agent
  // rendezvous] in agent_rendezvous.cpp): true when --rdzv-endpoint is given
  // with --nnodes MIN:MAX, MIN < MAX. master_addr:master_port is then the
  // rendezvous endpoint, whose agent serves the store; node_rank and nnodes
  // are decided per generation by the rendezvous.
  bool multi_agent = false;
  // This agent's name in the rendezvous; nodes are ranked by it, so a node
  // keeps its node rank across generations when membership allows. Empty:
  // host-pid. Two agents of one job must not share it.
  std::string node_id;
  // The members' node ids by node rank, set per generation by the
  // multi-agent rendezvous; empty elsewhere ("node N" names node rank N).
  // Lets a failure name the node a lost rank ran on.
  std::vector<std::string> node_names;
  // torchrun's join_timeout: how long an agent waits for MIN nodes before the
  // launch fails. Longer tolerates slow schedulers; shorter fails sooner.
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(600)};
  // torchrun's last_call_timeout: once MIN nodes are in, how long to wait for
  // more (up to MAX) before the generation closes. Longer gathers stragglers
  // into the first generation (no restart later to absorb them); shorter
  // starts sooner.
  std::chrono::milliseconds rdzv_last_call{std::chrono::seconds(10)};
  // An agent whose keep-alive counter in the store has not moved for this
  // long is dead: the others stop their workers and re-rendezvous without it.
  std::chrono::milliseconds rdzv_keep_alive_timeout{std::chrono::seconds(15)};
};

// How one worker ended.
struct WorkerOutcome {
  int rank = -1;        // global rank
  int local_rank = -1;
  pid_t pid = -1;       // also the id of its process group
  bool exited = false;  // true: exit_code is valid; false: killed by `signal`
  int exit_code = 0;
  int signal = 0;
  // The launcher signalled it before it ended (another rank failed first, or
  // the launcher itself was interrupted): a consequence, not a cause.
  bool stopped_by_launcher = false;
  // When the launcher saw it end (reaped it); workers seen in the same sweep
  // share the time. Orders failures: see pick_first_failure in report.h.
  std::chrono::steady_clock::time_point ended_at{};
  // The end of its output (prefixed output only) says a peer went away
  // ("connection reset", "connection closed", "broken pipe", "peer"): most
  // likely a victim of another rank's failure, not its cause.
  bool peer_error = false;
  // What its output says about the lost peer, in the launcher's words
  // (describe_peer_loss in report.h): which node, which ranks, and whether a
  // connection closed, a collective timed out or heartbeats stopped. Empty
  // when the output names no peer loss.
  std::string peer_loss{};
  // It failed under keep_going (not rank 0): reported, the others went on.
  bool tolerated = false;
  // Non-empty: the launcher stopped it because its heartbeats stopped (a
  // stopped or frozen process); says for how long and its last collective.
  std::string hang{};

  bool ok() const { return exited && exit_code == 0; }
  // It stopped at a checkpoint on a preemption signal (kPreemptedExitCode):
  // not a failure that stops the others; the launch exits with that code.
  bool preempted() const { return exited && exit_code == kPreemptedExitCode; }
  // The shell's convention: the exit code, or 128 + signal.
  int shell_code() const { return exited ? exit_code : 128 + signal; }
};

struct LaunchReport {
  // 0 when every worker exited 0, or some did and the others' failures were
  // tolerated (keep_going); else the first failing worker's shell_code(), or
  // 128 + the signal the launcher received. Never 0 when no worker succeeded.
  int exit_code = 0;
  std::vector<WorkerOutcome> workers;  // indexed by local rank
  // Local rank of the failure named as the cause, -1 if none: the earliest
  // one that failed on its own, see pick_first_failure in report.h.
  int first_failed = -1;
  int received_signal = 0;             // signal forwarded to the workers, 0 if none
  std::string master_addr;             // what the workers were given
  int master_port = 0;                 // ... including a port picked because 0 was passed
  std::string summary;                 // the one-line summary printed last
  // Restarts that happened (0..max_restarts); `workers` describes the last
  // generation, `failures` the failure that ended each earlier one.
  int restarts = 0;
  std::vector<WorkerOutcome> failures;
  // Multi-agent launches: the rendezvous generations this agent's workers
  // ran in (one per generation), with each one's world size.
  std::vector<int> generations;
  // Non-empty: the agent stopped the last generation's workers to
  // re-rendezvous (Supervisor::set_interrupt), and why.
  std::string rendezvous_stop;
  std::vector<int> world_sizes;
};

// Runs the workers to completion and returns the launcher's exit code. Throws
// ConfigError (before starting anything) on invalid options or a program that
// cannot be run, and Error if a worker could not be started (the ones already
// started are killed first). Installs handlers for SIGINT, SIGTERM and SIGHUP
// (unless they were ignored) and ignores SIGPIPE while it runs, restoring the
// previous dispositions afterwards; one launch at a time per process.
int launch(const LaunchOptions& options);

// The same, with every worker's outcome (for tests and embedders).
LaunchReport launch_with_report(const LaunchOptions& options);

// Throws ConfigError naming the flags and printing every value involved,
// e.g. "--node-rank 2 must be < --nnodes 2". Called by launch().
void validate(const LaunchOptions& options);

// torchrun's "--nnodes N" or "--nnodes MIN:MAX" -> {MIN, MAX}; throws
// ConfigError naming the flag on anything else ("0", "2:1", "a:b").
std::pair<int, int> parse_nnodes(const std::string& text);

// torchrun's "--rdzv-endpoint HOST[:PORT]" ("[::1]:29400" for IPv6) ->
// {host, port}; the port defaults to 29400 as torchrun's does. Throws
// ConfigError naming the flag on an empty host or a bad port.
std::pair<std::string, int> parse_endpoint(const std::string& text);

}  // namespace paratrain::launch

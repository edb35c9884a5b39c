// The launcher's supervision loop (see supervisor.h).
#include "paratrain/launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/launch/report.h"
#include "paratrain/launch/spawn.h"
#include "paratrain/launch/worker_env.h"

extern char** environ;

namespace paratrain::launch {
namespace {

// Note [Stopping workers]
// The loop wakes at least every monitor_interval (default 50 ms) to reap workers (waitpid WNOHANG) and
// to escalate; pipes and the signal pipe wake it sooner. The first worker
// that ends badly, or the first SIGINT/SIGTERM/SIGHUP to the launcher, stops
// every process group that still has a live process: that signal now (SIGTERM
// for a failure, the received one when forwarding), SIGKILL kill_grace later.
// A second signal to the launcher sends SIGKILL at once. When every worker is
// reaped, a group that still has processes (a grandchild) gets the same
// treatment, so nothing started by the launch outlives it. The loop ends when
// no group has a live process and every pipe reached EOF, or kSettle after
// the last possible SIGKILL: a pipe held open by a process that left its
// group (setsid) cannot make the launcher hang.
constexpr auto kSettle = std::chrono::seconds(1);
constexpr std::size_t kReadChunk = 64 * 1024;
// Output still buffered in a pipe when the loop ends is copied up to here.
constexpr std::size_t kFinalDrain = 1 << 20;
// How much of each worker's latest output is kept to tell a victim ("connection
// reset by peer") from a cause: the last error message, not the whole log.
constexpr std::size_t kTailBytes = 4096;

std::string seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", static_cast<double>(ms.count()) / 1000.0);
}

}  // namespace

Supervisor::Supervisor(const LaunchOptions& options, std::string program, SignalCapture& signals)
    : options_(options), program_(std::move(program)), signals_(signals) {}

Supervisor::~Supervisor() {
  for (auto& w : workers_) {
    if (w.outcome.pid > 0 && !w.reaped) {
      signal_group(w.outcome.pid, SIGKILL);
      while (waitpid(w.outcome.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      w.reaped = true;
    }
  }
  close_streams();
}

void Supervisor::start() {
  std::vector<int> ignored;
  for (int sig : SignalCapture::kForwarded) {
    if (signals_.was_ignored(sig)) ignored.push_back(sig);
  }
  if (signals_.was_ignored(SIGPIPE)) ignored.push_back(SIGPIPE);
  workers_.reserve(static_cast<std::size_t>(options_.nproc_per_node));
  for (int local = 0; local < options_.nproc_per_node; ++local) {
    Worker& w = workers_.emplace_back();
    w.outcome.local_rank = local;
    w.outcome.rank = options_.node_rank * options_.nproc_per_node + local;

    SpawnSpec spec;
    spec.path = program_;
    spec.argv = options_.command;
    spec.env = worker_environment(options_, local, environ);
    // Workers write into pipes; tell them the launcher's stderr is a
    // terminal, where rank 0 may draw a progress bar (train/run/progress.h).
    const bool terminal_err = options_.prefix_output && isatty(options_.err_fd);
    if (terminal_err && !getenv("PARATRAIN_PROGRESS")) spec.env.emplace_back("PARATRAIN_PROGRESS=1");
    if (!options_.heartbeat_dir.empty()) {
      w.heartbeat.emplace(std::filesystem::path(options_.heartbeat_dir) / fmt::format("rank-{}.json", w.outcome.rank));
    }
    spec.ignored_signals = ignored;
    spec.stdout_fd = options_.out_fd;
    spec.stderr_fd = options_.err_fd;
    int child_ends[2] = {-1, -1};
    if (options_.prefix_output) {
      const int sinks[2] = {options_.out_fd, options_.err_fd};
      for (int i = 0; i < 2; ++i) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) {
          if (child_ends[0] >= 0) close(child_ends[0]);
          throw Error(fmt::format("launcher: pipe for rank {} failed: {}", w.outcome.rank, std::strerror(errno)));
        }
        fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
        w.streams.push_back(
            Stream{fds[0], LinePrefixer(fmt::format("[{}]: ", w.outcome.rank), sinks[i], isatty(sinks[i]) == 1)});
        child_ends[i] = fds[1];
      }
      spec.stdout_fd = child_ends[0];
      spec.stderr_fd = child_ends[1];
    }
    try {
      w.outcome.pid = spawn_in_new_group(spec);
    } catch (const Error& e) {
      for (int fd : child_ends) {
        if (fd >= 0) close(fd);
      }
      throw Error(fmt::format("rank {}: {}", w.outcome.rank, e.what()));
    }
    // Only the child may hold the write ends, so EOF means it (and its group) is done.
    for (int fd : child_ends) {
      if (fd >= 0) close(fd);
    }
  }
}

LaunchReport Supervisor::run() {
  std::vector<int> ranks;
  for (const auto& w : workers_) ranks.push_back(w.outcome.rank);
  say(fmt::format("paratrain launch: started {} of {} (node {} of {}), MASTER_ADDR={} MASTER_PORT={}{}",
                  rank_list(ranks), options_.nproc_per_node * options_.nnodes, options_.node_rank,
                  options_.nnodes, options_.master_addr, options_.master_port,
                  options_.restart_count == 0 ? std::string()
                  // Multi-agent generations count membership changes too: no "restart k".
                  : options_.multi_agent ? fmt::format(", generation {}", options_.restart_count)
                                         : fmt::format(", generation {} (restart {} of {})", options_.restart_count,
                                                       options_.restart_count, options_.max_restarts)));
  while (true) {
    const auto now = Clock::now();
    reap(now);
    if (all_reaped()) {
      if (!all_reaped_at_) {
        all_reaped_at_ = now;
        for (auto& w : workers_) {
          if (!w.term_sent && group_has_live_members(w.outcome.pid)) stop(w, SIGTERM, now);
        }
      }
      if (!anything_left()) break;
      if (now >= *all_reaped_at_ + options_.kill_grace + kSettle) {
        say("paratrain launch: worker output is still held open by a process outside the workers' "
            "process groups; not waiting for it");
        break;
      }
    }
    if (!stopping_ && silent_ < 0) check_heartbeats(now);
    if (!stopping_ && silent_ < 0 && interrupt_) {
      interrupted_ = interrupt_(now);
      if (!interrupted_.empty()) {
        say(fmt::format("paratrain launch: {}; stopping this node's workers to re-rendezvous (SIGTERM, SIGKILL "
                        "after {})",
                        interrupted_, seconds(options_.kill_grace)));
        stop_all(SIGTERM, now);
      }
    }
    if (!stopping_ && silent_ >= 0) finish_doctor_wait(now);
    escalate(now);
    pump(options_.monitor_interval);
  }
  close_streams();

  LaunchReport report;
  for (auto& w : workers_) {
    w.outcome.peer_error = mentions_lost_peer(w.tail);
    if (w.outcome.peer_error && !w.outcome.ok())
      w.outcome.peer_loss = describe_peer_loss(w.tail, options_.nproc_per_node, options_.node_names);
    report.workers.push_back(w.outcome);
  }
  // The failure that triggered the stop is only the first one reaped; with
  // every outcome and output in, name the likeliest cause instead (Note
  // [Naming the first failure]). A launch stopped by a signal names none.
  report.first_failed = first_failed_ >= 0 ? pick_first_failure(report.workers) : -1;
  report.received_signal = received_signal_;
  report.rendezvous_stop = interrupted_;
  report.master_addr = options_.master_addr;
  report.master_port = options_.master_port;
  // Printed by launch_with_report, which knows whether a restart follows.
  report.summary = summarize(report);
  return report;
}

// Note [Naming the first failure]
// A rank that fails takes its peers down with it: they see "connection reset
// by peer" and exit non-zero too, sometimes before the failing rank itself is
// reaped (its exit may be slower than their error path), and the launcher's
// own SIGTERM kills the rest. So the rank reaped first is not always the
// cause. Each sweep reaps every worker that ended before stopping anyone, so
// workers ending together all count as ending on their own; each outcome keeps
// the sweep's time (resolution: one monitor interval) and whether its output blamed a
// peer; at the end pick_first_failure (report.h) prefers ranks that failed on
// their own, then the earliest.
void Supervisor::reap(Clock::time_point now) {
  const Worker* trigger = nullptr;
  for (auto& w : workers_) {
    if (w.reaped) continue;
    int status = 0;
    const pid_t r = waitpid(w.outcome.pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    w.reaped = true;
    if (r < 0) {
      // ECHILD: someone else in this process reaped it; the status is lost.
      w.outcome.exited = true;
      w.outcome.exit_code = 255;
      say(fmt::format("paratrain launch: rank {} (pid {}) was reaped by someone else; counting it as "
                      "failed with code 255", w.outcome.rank, w.outcome.pid));
    } else if (WIFEXITED(status)) {
      w.outcome.exited = true;
      w.outcome.exit_code = WEXITSTATUS(status);
    } else {
      w.outcome.exited = false;
      w.outcome.signal = WTERMSIG(status);
    }
    w.outcome.ended_at = now;
    if (w.outcome.preempted()) {
      say(fmt::format("paratrain launch: rank {} (pid {}) stopped at a checkpoint on a preemption signal (exit code {})",
                      w.outcome.rank, w.outcome.pid, kPreemptedExitCode));
      continue;  // not a failure: its peers reach the same checkpoint and stop too
    }
    if (!w.outcome.ok() && !stopping_ && options_.keep_going &&
        (w.outcome.rank != 0 || options_.keep_going_rank0)) {
      w.outcome.tolerated = true;
      say(fmt::format("paratrain launch: {}; --keep-going: the other ranks go on", describe(w.outcome)));
      if (on_tolerated_) on_tolerated_(w.outcome);
      continue;
    }
    if (!w.outcome.ok() && !stopping_ && trigger == nullptr) trigger = &w;
  }
  if (trigger != nullptr) {
    first_failed_ = trigger->outcome.local_rank;
    say(fmt::format("paratrain launch: {}; stopping the other ranks (SIGTERM, SIGKILL after {})",
                    describe(trigger->outcome), seconds(options_.kill_grace)));
    stop_all(SIGTERM, now);
  }
}

void Supervisor::on_signal(int sig, Clock::time_point now) {
  if (sig == SIGUSR1) {
    // Not a stop: the user asks for the hang doctor's records (`kill -USR1 <launcher>`).
    const auto asked = ask_for_records(-1);
    say(fmt::format("paratrain launch: got SIGUSR1; asked {} worker{} for their hang-doctor records (RUN_DIR/doctor/; "
                    "then `paratrain doctor --run RUN_DIR --no-signal`)",
                    asked.size(), asked.size() == 1 ? "" : "s"));
    return;
  }
  if (sig == SIGUSR2) {
    // Not a stop either: a scheduler's early warning (Slurm's --signal=USR2@60),
    // which the workers turn into a preemption checkpoint when
    // train.preempt_signals names it. Passed on as it is.
    say("paratrain launch: got SIGUSR2; passing it on to the workers");
    for (auto& w : workers_)
      if (!w.reaped) signal_group(w.outcome.pid, SIGUSR2);
    return;
  }
  if (!stopping_) {
    received_signal_ = sig;
    say(fmt::format("paratrain launch: got {}; forwarding it to the workers (SIGKILL after {})",
                    signal_name(sig), seconds(options_.kill_grace)));
    stop_all(sig, now);
    return;
  }
  // Already stopping: the user wants it over now.
  say(fmt::format("paratrain launch: got {} while stopping; killing the workers now", signal_name(sig)));
  for (auto& w : workers_) {
    if (!w.reaped || group_has_live_members(w.outcome.pid)) {
      stop(w, SIGKILL, now);
      w.kill_sent = true;
    }
  }
}

// Note [Silent workers]
// A worker's watchdog thread rewrites its heartbeat file every
// world.heartbeat_s, whatever its main thread is doing (a long collective
// included, so long collectives keep their own world.timeout_s). A counter
// that stops changing for longer than world.heartbeat_timeout_s means the
// whole process stopped: SIGSTOP, a debugger, a frozen machine. Then:
// 1. the silent rank is named with its process state and the last collective
//    its final beat described, and that beat (a doctor dump of its newest
//    records) is copied to <run_dir>/doctor/rank-<r>.json: it cannot dump now;
// 2. every other beating worker gets SIGUSR1 and writes its own dump;
// 3. once those dumps are fresh, or after doctor_wait, the silent rank gets
//    SIGKILL (a stopped process cannot act on SIGTERM) and the rest the usual
//    SIGTERM, and the launch fails (or restarts under --max-restarts) naming
//    the silent rank as the cause (report.h, tier 0).
// A worker that exited has no live heartbeat to miss: reap() sees it first.
// Files are read at most every kHeartbeatCheck.
// Note [A suspended job]
// A scheduler that time-slices jobs (Slurm's PreemptMode=SUSPEND,GANG) or a
// user's Ctrl-Z stops every process of the job, the launcher included, and
// continues them later. On waking, every worker's last beat is as old as
// the pause, which would read as a stopped worker. A pause of the launcher
// itself shows as a gap between two of its checks (which run every 200 ms,
// or every monitor_interval when that is longer): after a gap of a second
// more than that, silence is measured from the wake-up.
// A single stopped worker leaves the launcher running, so it is still
// caught after its timeout. The ranks' own peer watch does the same
// (comm/peer_watch.cpp).
void Supervisor::check_heartbeats(Clock::time_point now) {
  constexpr auto kHeartbeatCheck = std::chrono::milliseconds(200);
  // A pause is a gap well beyond what this loop's own wait (monitor_interval) explains.
  const auto paused = std::max<std::chrono::milliseconds>(std::chrono::seconds(1),
                                                          options_.monitor_interval + std::chrono::seconds(1));
  if (next_heartbeat_check_ && now < *next_heartbeat_check_) return;
  if (last_heartbeat_check_ && now - *last_heartbeat_check_ > paused) {
    say(fmt::format("paratrain launch: this launcher did not run for {:.1f} s (the job was suspended?); "
                    "heartbeats are measured from now",
                    std::chrono::duration<double>(now - *last_heartbeat_check_).count()));
    for (auto& w : workers_)
      if (w.heartbeat) w.heartbeat->forgive(now);
  }
  last_heartbeat_check_ = now;
  next_heartbeat_check_ = now + kHeartbeatCheck;
  for (auto& w : workers_) {
    if (w.reaped || !w.heartbeat || !w.heartbeat->silent(now)) continue;
    const Heartbeat& hb = *w.heartbeat->last();
    const pid_t pid = hb.pid > 0 ? static_cast<pid_t>(hb.pid) : w.outcome.pid;
    w.outcome.hang = fmt::format(
        "sent no heartbeat for {:.1f} s (world.heartbeat_timeout_s = {:g} s; the process is {}); its last "
        "collective: {}",
        w.heartbeat->silent_for(now), static_cast<double>(hb.timeout_ms) / 1000.0, process_state(pid), hb.last_op);
    say(fmt::format("paratrain launch: {}; asking the other ranks for their hang-doctor records (SIGUSR1), then "
                    "stopping them", describe(w.outcome)));
    if (!hb.doctor_dir.empty()) {
      std::error_code ec;
      const auto saved = std::filesystem::path(hb.doctor_dir) / fmt::format("rank-{}.json", w.outcome.rank);
      std::filesystem::create_directories(hb.doctor_dir, ec);
      std::filesystem::copy_file(w.heartbeat->file(), saved, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) say(fmt::format("paratrain launch: could not save rank {}'s last heartbeat as {}: {}", w.outcome.rank,
                              saved.string(), ec.message()));
    }
    silent_ = w.outcome.local_rank;
    first_failed_ = silent_;
    doctor_pending_ = ask_for_records(silent_);
    doctor_deadline_ = now + options_.doctor_wait;
    return;
  }
}

void Supervisor::finish_doctor_wait(Clock::time_point now) {
  for (auto it = doctor_pending_.begin(); it != doctor_pending_.end();) {
    const auto& hb = workers_[static_cast<std::size_t>(it->first)].heartbeat->last();
    std::error_code ec;
    const auto t = std::filesystem::last_write_time(
        std::filesystem::path(hb->doctor_dir) /
            fmt::format("rank-{}.json", workers_[static_cast<std::size_t>(it->first)].outcome.rank),
        ec);
    it = !ec && t > it->second ? doctor_pending_.erase(it) : std::next(it);
  }
  if (!doctor_pending_.empty() && now < doctor_deadline_) return;
  Worker& w = workers_[static_cast<std::size_t>(silent_)];
  const auto& hb = w.heartbeat->last();
  if (hb && !hb->doctor_dir.empty()) {
    say(fmt::format("paratrain launch: hang-doctor records are in {}; diagnose with `paratrain doctor --run {} "
                    "--no-signal`",
                    hb->doctor_dir, std::filesystem::path(hb->doctor_dir).parent_path().string()));
  }
  stop(w, SIGKILL, now);
  w.kill_sent = true;
  say(fmt::format("paratrain launch: stopping the other ranks (SIGTERM, SIGKILL after {})",
                  seconds(options_.kill_grace)));
  stop_all(SIGTERM, now);
}

std::map<int, std::filesystem::file_time_type> Supervisor::ask_for_records(int except) {
  std::map<int, std::filesystem::file_time_type> asked;
  for (auto& w : workers_) {
    if (w.reaped || w.outcome.local_rank == except || !w.heartbeat || !w.heartbeat->last()) continue;
    const Heartbeat& hb = *w.heartbeat->last();
    if (hb.state != "running" || hb.pid <= 0) continue;
    std::error_code ec;
    const auto dump = std::filesystem::path(hb.doctor_dir) / fmt::format("rank-{}.json", w.outcome.rank);
    auto before = std::filesystem::last_write_time(dump, ec);
    if (ec) before = std::filesystem::file_time_type::min();
    // The beating process itself (the launched program may be a wrapper):
    // it installed the SIGUSR1 handler before its first beat.
    // A rank whose last beat had no doctor dir yet may have one by now: wait for it too.
    if (kill(static_cast<pid_t>(hb.pid), SIGUSR1) == 0) asked[w.outcome.local_rank] = before;
  }
  return asked;
}

void Supervisor::stop_all(int sig, Clock::time_point now) {
  stopping_ = true;
  for (auto& w : workers_) {
    if (!w.reaped || group_has_live_members(w.outcome.pid)) stop(w, sig, now);
  }
}

void Supervisor::stop(Worker& w, int sig, Clock::time_point now) {
  signal_group(w.outcome.pid, sig);
  if (!w.term_sent) w.term_sent = now;
  if (!w.reaped) w.outcome.stopped_by_launcher = true;
}

void Supervisor::escalate(Clock::time_point now) {
  for (auto& w : workers_) {
    if (!w.term_sent || w.kill_sent || now < *w.term_sent + options_.kill_grace) continue;
    if (!w.reaped || group_has_live_members(w.outcome.pid)) signal_group(w.outcome.pid, SIGKILL);
    w.kill_sent = true;
  }
}

bool Supervisor::all_reaped() const {
  for (const auto& w : workers_) {
    if (!w.reaped) return false;
  }
  return true;
}

bool Supervisor::anything_left() const {
  for (const auto& w : workers_) {
    for (const auto& s : w.streams) {
      if (s.fd >= 0) return true;
    }
  }
  for (const auto& w : workers_) {
    if (group_has_live_members(w.outcome.pid)) return true;
  }
  return false;
}

void Supervisor::pump(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  std::vector<Stream*> owners{nullptr};
  std::vector<Worker*> owner_workers{nullptr};
  for (auto& w : workers_) {
    for (auto& s : w.streams) {
      if (s.fd < 0) continue;
      fds.push_back({s.fd, POLLIN, 0});
      owners.push_back(&s);
      owner_workers.push_back(&w);
    }
  }
  if (poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return;
  if (fds[0].revents != 0) {
    while (const int sig = signals_.take()) on_signal(sig, Clock::now());
  }
  char buf[kReadChunk];
  for (std::size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    Stream& s = *owners[i];
    const ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.prefixer.feed(std::string_view(buf, static_cast<std::size_t>(n)));
      keep_tail(*owner_workers[i], std::string_view(buf, static_cast<std::size_t>(n)));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      s.prefixer.finish();
      close(s.fd);
      s.fd = -1;
    }
  }
}

void Supervisor::close_streams() {
  char buf[kReadChunk];
  for (auto& w : workers_) {
    for (auto& s : w.streams) {
      if (s.fd < 0) continue;
      for (std::size_t copied = 0; copied < kFinalDrain;) {
        const ssize_t n = read(s.fd, buf, sizeof buf);
        if (n <= 0) break;
        s.prefixer.feed(std::string_view(buf, static_cast<std::size_t>(n)));
        keep_tail(w, std::string_view(buf, static_cast<std::size_t>(n)));
        copied += static_cast<std::size_t>(n);
      }
      s.prefixer.finish();
      close(s.fd);
      s.fd = -1;
    }
  }
}

void Supervisor::keep_tail(Worker& w, std::string_view chunk) {
  if (chunk.size() >= kTailBytes) chunk = chunk.substr(chunk.size() - kTailBytes);
  w.tail.append(chunk);
  if (w.tail.size() > kTailBytes) w.tail.erase(0, w.tail.size() - kTailBytes);
}

void Supervisor::say(const std::string& line) const {
  write_all(options_.err_fd, line + "\n");
}

}  // namespace paratrain::launch

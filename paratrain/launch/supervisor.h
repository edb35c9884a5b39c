// The launcher's event loop: starts the workers, copies their output, reaps
// them, and stops them all on the first failure or a forwarded signal. Not
// public API: launch() in launcher.h drives it.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/launch/heartbeat_monitor.h"
#include "paratrain/launch/launcher.h"
#include "paratrain/launch/line_prefixer.h"
#include "paratrain/launch/signal_capture.h"

namespace paratrain::launch {

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  // `options` resolved (address and port filled in), `program` resolved.
  Supervisor(const LaunchOptions& options, std::string program, SignalCapture& signals);
  ~Supervisor();  // kills and reaps whatever is still running (exceptions)
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every local rank. Throws Error after killing the ones started.
  void start();
  // Runs until every worker and its process group are gone; returns the report.
  LaunchReport run();
  // Multi-agent launches: asked every loop turn while no stop is under way;
  // a non-empty answer (why) stops every worker (SIGTERM, then SIGKILL) as
  // for a failure, but names no worker: the report's rendezvous_stop says why.
  void set_interrupt(std::function<std::string(Clock::time_point)> interrupt) { interrupt_ = std::move(interrupt); }
  // Called once for each failure that keep_going tolerates, after it is
  // reported (the launcher ends the others' check-in with it).
  void set_on_tolerated(std::function<void(const WorkerOutcome&)> on_tolerated) {
    on_tolerated_ = std::move(on_tolerated);
  }

 private:
  struct Stream {
    int fd = -1;  // read end of the worker's pipe; -1 once closed
    LinePrefixer prefixer;
  };
  struct Worker {
    WorkerOutcome outcome;
    bool reaped = false;
    std::optional<Clock::time_point> term_sent;  // first signal to its group
    bool kill_sent = false;
    std::vector<Stream> streams;  // stdout, stderr (empty without prefixing)
    std::string tail;             // the last kTailBytes of its output, both streams
    std::optional<HeartbeatWatch> heartbeat;  // when options_.heartbeat_dir is set
  };

  void reap(Clock::time_point now);
  void on_signal(int sig, Clock::time_point now);
  void stop_all(int sig, Clock::time_point now);
  void stop(Worker& w, int sig, Clock::time_point now);
  void escalate(Clock::time_point now);
  bool all_reaped() const;
  bool anything_left() const;
  void pump(std::chrono::milliseconds timeout);
  void close_streams();
  void keep_tail(Worker& w, std::string_view chunk);
  void say(const std::string& line) const;
  // Heartbeats: Note [Silent workers] in supervisor.cpp.
  void check_heartbeats(Clock::time_point now);
  void finish_doctor_wait(Clock::time_point now);
  // SIGUSR1 to every worker that beats, except local rank `except`; returns
  // the local ranks asked, with their dump file's time before asking.
  std::map<int, std::filesystem::file_time_type> ask_for_records(int except);

  LaunchOptions options_;
  std::string program_;
  SignalCapture& signals_;
  std::vector<Worker> workers_;
  bool stopping_ = false;
  int first_failed_ = -1;
  int received_signal_ = 0;
  std::optional<Clock::time_point> all_reaped_at_;
  std::optional<Clock::time_point> next_heartbeat_check_;
  std::optional<Clock::time_point> last_heartbeat_check_;  // Note [A suspended job]
  int silent_ = -1;  // local rank that went silent, while the others dump
  Clock::time_point doctor_deadline_{};
  std::map<int, std::filesystem::file_time_type> doctor_pending_;
  std::function<std::string(Clock::time_point)> interrupt_;
  std::function<void(const WorkerOutcome&)> on_tolerated_;
  std::string interrupted_;
};

}  // namespace paratrain::launch

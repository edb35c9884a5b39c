// Catches SIGINT, SIGTERM and SIGHUP while the launcher runs so it can
// forward them to the workers (and SIGUSR1, which asks the workers for their
// hang-doctor records without stopping anything, and SIGUSR2, passed on as it
// is: Slurm's --signal=USR2@60 for train.preempt_signals), and keeps SIGPIPE from killing the launcher
// (which would orphan the workers) when its own stdout goes away. Not a
// general signal library: one instance at a time per process.
#pragma once

#include <csignal>
#include <iterator>

namespace paratrain::launch {

// Self-pipe trick: the handler only writes the signal number to a pipe (about
// all a handler may safely do); the supervisor polls fd() with the worker
// pipes and calls take(). A signal that was ignored when this was built (e.g.
// SIGHUP under nohup, SIGINT in a background job) stays ignored, as shells do.
class SignalCapture {
 public:
  static constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

  SignalCapture();   // throws Error if another SignalCapture is alive
  ~SignalCapture();  // restores every disposition it changed
  SignalCapture(const SignalCapture&) = delete;
  SignalCapture& operator=(const SignalCapture&) = delete;

  int fd() const { return read_fd_; }
  // The next captured signal number, or 0 when none is pending.
  int take();
  // Whether `sig` was ignored before the launcher started: workers inherit
  // that (exec keeps SIG_IGN), everything else starts at SIG_DFL.
  bool was_ignored(int sig) const;

 private:
  static constexpr int kChanged[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGUSR1, SIGUSR2};
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction old_[std::size(kChanged)] = {};
  bool changed_[std::size(kChanged)] = {};
  sigset_t old_mask_{};
};

}  // namespace paratrain::launch

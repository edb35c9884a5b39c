// Records in run.json that `paratrain train` was stopped by a signal
// (SIGTERM from `paratrain launch`, a scheduler or kill; SIGINT from Ctrl-C;
// SIGHUP), so `paratrain runs` says "stopped" instead of "died".
#pragma once

#include <filesystem>
#include <thread>
#include <vector>

namespace paratrain::cli {

// While alive: SIGTERM, SIGINT and SIGHUP write {"status": "stopped",
// "signal": "SIGTERM", "ended": <time>} into <run_dir>/run.json, then end
// the process by the same signal, as if there were no handler (the launcher
// and shells still see "killed by SIGTERM"). Rank 0 only: it owns run.json.
// The destructor restores the previous handlers. While the training loop
// runs, train.preempt_signals' handlers sit above these: the first signal
// preempts (the run records "preempted" itself), and one that insists is
// handed down to these, which record "stopped" and end the process
// (train/run/preemption.cpp).
class StopStatusRecorder {
 public:
  explicit StopStatusRecorder(std::filesystem::path run_dir);
  ~StopStatusRecorder();
  StopStatusRecorder(const StopStatusRecorder&) = delete;
  StopStatusRecorder& operator=(const StopStatusRecorder&) = delete;

 private:
  void watch();
  std::filesystem::path run_dir_;
  std::thread thread_;
};

}  // namespace paratrain::cli

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
// The destructor restores the previous handlers.
class StopStatusRecorder {
 public:
  // `preempting`: signals train.preempt_signals owns (the run checkpoints
  // and records "preempted" itself); they are left alone here.
  StopStatusRecorder(std::filesystem::path run_dir, const std::vector<int>& preempting);
  ~StopStatusRecorder();
  StopStatusRecorder(const StopStatusRecorder&) = delete;
  StopStatusRecorder& operator=(const StopStatusRecorder&) = delete;

 private:
  void watch();
  std::filesystem::path run_dir_;
  std::thread thread_;
};

}  // namespace paratrain::cli

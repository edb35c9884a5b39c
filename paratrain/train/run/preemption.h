// The signals of train.preempt_signals while a run trains: the first one
// sets a flag that the loop's PreemptionCheck (loop/preemption_check.h)
// reads at a step boundary, where every rank agrees to stop, save and exit
// with kPreemptedExitCode; another one ends the process at once (128 +
// signal), except the same signal repeated within two seconds (Note [A
// signal that insists] in preemption.cpp). A checkpoint commits its
// index.json last, so one cut short that way is never taken for complete.
#pragma once

#include <string>
#include <vector>

namespace paratrain::train {

/// "SIGTERM,SIGUSR2" (names with or without "SIG", spaces allowed; "" = none)
/// -> signal numbers. ConfigError naming the one it does not know.
std::vector<int> parse_preempt_signals(const std::string& text);

/// "SIGTERM", "SIGUSR2", ...
std::string preempt_signal_name(int signal);

/// While alive, `signals` preempt this process. Several may live at once
/// (ranks as threads of one process): the handlers stay until the last ends.
class PreemptionSignals {
 public:
  explicit PreemptionSignals(const std::vector<int>& signals);
  ~PreemptionSignals();
  PreemptionSignals(const PreemptionSignals&) = delete;
  PreemptionSignals& operator=(const PreemptionSignals&) = delete;

  /// The first preemption signal this process received (0: none yet).
  static int received();
  /// Forgets a received signal (a test that preempts twice in one process).
  static void clear();

 private:
  std::vector<int> signals_;
};

}  // namespace paratrain::train

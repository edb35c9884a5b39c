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

struct TrainConfig;

/// "SIGTERM,SIGUSR2" (names with or without "SIG", spaces allowed; "" = none;
/// "auto" = SIGTERM,SIGINT) -> signal numbers. ConfigError naming the one it
/// does not know.
std::vector<int> parse_preempt_signals(const std::string& text);

/// "SIGTERM", "SIGUSR2", ...
std::string preempt_signal_name(int signal);

/// The signals that preempt a run of `config`: train.preempt_signals, where
/// "auto" (the default) is SIGTERM and SIGINT, or none where
/// preemption_auto_off says why.
std::vector<int> preempt_signals_of(const TrainConfig& config);

/// Why a run of `config` cannot be preempted at a step boundary ("" when it
/// can): elastic.in_job re-forms the world the agreement runs on, and
/// asynchronous parameter servers taking dynamic batches meet too rarely.
std::string preemption_unavailable(const TrainConfig& config);

/// Why "auto" is off for `config` ("" when it is on): preemption_unavailable,
/// or parameter servers, which would pay a world all-reduce per step for it.
std::string preemption_auto_off(const TrainConfig& config);

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

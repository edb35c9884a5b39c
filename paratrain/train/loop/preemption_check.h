// The loop's preemption part (train.preempt_signals, run/preemption.h): at
// every point where all ranks meet it says whether any rank had received a
// preemption signal by the meeting before. That agreement is an all-reduce
// (max) of one number, started at one meeting and waited for at the next, so
// it rides along a step instead of adding a round trip to it: a signal is
// acted on at the second meeting after it arrives, the same one on every
// rank. Off (no collective at all) when train.preempt_signals is "" (or
// "auto" where it is off: run/preemption.h), and no collective at world
// size 1. The all-reduce goes under the flight recorder (Note [The
// agreement is bookkeeping]).
// Internal to paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "paratrain/comm/process_group.h"
#include "paratrain/train/run/preemption.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class PreemptionCheck {
 public:
  explicit PreemptionCheck(Trainer::State& s);
  /// At a meeting point, on every rank: true once the ranks agreed to stop.
  bool agreed();
  /// The signal they stopped for (0: none).
  int signal() const { return signal_; }
  /// The run ends: waits for the agreement still in flight (every rank calls it).
  void drain();

 private:
  Trainer::State& s_;
  std::optional<PreemptionSignals> signals_;
  at::Tensor flag_;
  comm::WorkHandle pending_;
  int signal_ = 0;
};

}  // namespace paratrain::train

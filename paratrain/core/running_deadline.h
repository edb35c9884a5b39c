// RunningDeadline: a timeout counted in time this process ran, so that a
// whole job stopped and continued later (gang scheduling, Ctrl-Z) does not
// fail every wait that was in flight when it stopped. See Note [Deadlines
// that stop with the process].
#pragma once

#include <chrono>

namespace paratrain {

// Note [Deadlines that stop with the process]
// A scheduler that time-slices jobs (Slurm's PreemptMode=SUSPEND,GANG,
// `scontrol suspend`) or a user's Ctrl-Z stops every process of a job with
// SIGSTOP and continues it later with SIGCONT. The monotonic clock runs on
// meanwhile, so a collective in flight would reach its world.timeout_s on
// waking although no peer ever failed it: every rank was stopped alike.
//
// A waiter therefore looks at the clock at least every kSlice and counts a
// gap of more than kPause between two looks as time it did not run: the
// deadline moves on by the whole gap. A stopped process cannot look, so a
// stop of any length shows as such a gap; a waiter that merely sleeps to
// its next look never makes one. A single stopped rank is still caught:
// its peers keep running and keep looking, so their deadlines stand (and
// the heartbeats name it first, comm/peer_watch.cpp). A machine so loaded
// that a waiter's thread is not scheduled for a second is read the same
// way; that only lengthens a timeout, never shortens it.
class RunningDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  /// How often a waiter must look (at most).
  static constexpr std::chrono::milliseconds kSlice{200};
  /// A gap between two looks longer than this was a stop.
  static constexpr std::chrono::milliseconds kPause{1000};

  explicit RunningDeadline(std::chrono::milliseconds timeout, Clock::time_point start = Clock::now());

  /// Looks at the clock (call it at every wake): true once `timeout` of
  /// running time has passed since the start.
  bool passed(Clock::time_point now = Clock::now());
  /// When the waiter should look again: the deadline, or kSlice from `now`
  /// when that is sooner.
  Clock::time_point next_look(Clock::time_point now = Clock::now()) const;
  /// The deadline as it stands (moved by every stop seen so far).
  Clock::time_point at() const { return at_; }
  /// Running time left (zero once passed).
  std::chrono::milliseconds left(Clock::time_point now = Clock::now()) const;
  /// How long the stops seen so far lasted.
  std::chrono::milliseconds stopped() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
  Clock::time_point at_;
  Clock::time_point last_look_;
  Clock::duration stopped_{0};
};

}  // namespace paratrain

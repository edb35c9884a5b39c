// One timeline for every rank's profile.
//
// Note [Profile clocks]
// Events are stamped with each process's system clock (the operator
// profiler's) or its steady clock (the flight recorder's; converted once
// with the pair of readings taken at alignment). Processes on one host
// share the system clock, so their events need no shift. Across hosts the
// clocks differ by whatever NTP left (often milliseconds), so each rank
// takes its system time as it leaves a barrier and shifts its events by
// rank 0's reading minus its own: the barrier's exits differ by one message
// latency, which bounds the error. Then a second barrier measures what is
// left: the spread of the shifted exit times over the ranks (skew_us,
// written to every rank file and printed by `paratrain profile`).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace paratrain::comm {
class ProcessGroup;
}

namespace paratrain::profile {

/// How this rank's clock maps onto rank 0's.
struct ClockAlignment {
  /// "one host" (every rank on one machine: the same clock, no shift) or
  /// "barrier" (shifted by rank 0's reading at a barrier's exit).
  std::string method = "one host";
  int64_t offset_us = 0;  ///< added to this rank's system-clock times
  /// The spread of the ranks' aligned exit times from a second barrier: the
  /// alignment's residual error, as measured (0 with one rank).
  int64_t skew_us = 0;
  /// system clock minus steady clock at alignment, in microseconds: turns the
  /// flight recorder's steady times into system times.
  int64_t steady_to_system_us = 0;
};

/// Collective over `world`: every rank calls it (at the same point).
ClockAlignment align_clocks(comm::ProcessGroup& world, std::chrono::milliseconds timeout);

}  // namespace paratrain::profile

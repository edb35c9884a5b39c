// The launcher's side of heartbeats: each worker's watchdog thread rewrites
// <dir>/rank-<r>.json every world.heartbeat_s (comm/doctor/doctor_watchdog.h); the
// launcher reads the beat counter and notices one that stopped changing for
// longer than the timeout the worker wrote into it. Files, not the store: the
// c10d store is served by rank 0, and a stopped rank 0 would take its own
// heartbeats down with it, while the launcher outlives any worker. std + POSIX
// only (the launcher links no JSON library): the file puts one field per line.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "paratrain/core/process_state.h"

namespace paratrain::launch {

// The fields of a heartbeat file the launcher uses.
struct Heartbeat {
  long long beat = 0;           // increases with every beat
  long long timeout_ms = 0;     // world.heartbeat_timeout_s of that worker
  long long pid = 0;            // the process that beats (a wrapper's child, maybe)
  std::string state;            // "running" or "exiting" (a clean shutdown: stop watching)
  std::string last_op;          // the worker's own summary of its last collective
  std::string doctor_dir;       // where its doctor dumps go ("" before the run dir exists)
};

// Parses a heartbeat file; nullopt when it is missing or incomplete.
std::optional<Heartbeat> read_heartbeat(const std::filesystem::path& file);

// process_state(pid) (core/process_state.h) says why a worker went silent.
using paratrain::process_state;

// One worker's heartbeat as the launcher follows it.
class HeartbeatWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HeartbeatWatch(std::filesystem::path file) : file_(std::move(file)) {}

  // Reads the file; returns true when the worker is silent: it beat at least
  // once, says "running", and its counter has not changed for longer than its
  // timeout (measured on the launcher's clock, so clocks need not agree).
  bool silent(Clock::time_point now);
  // The newest beat read (empty before the first).
  const std::optional<Heartbeat>& last() const { return last_; }
  // Seconds since the counter last changed.
  double silent_for(Clock::time_point now) const;
  // The launcher itself was not running until `now` (suspended with the
  // whole job): silence is measured from here (Note [A suspended job]).
  void forgive(Clock::time_point now) { changed_at_ = now; }
  const std::filesystem::path& file() const { return file_; }

 private:
  std::filesystem::path file_;
  std::optional<Heartbeat> last_;
  Clock::time_point changed_at_{};
};

}  // namespace paratrain::launch

// The hang doctor's watchdog: one thread per process that dumps every live
// flight recorder when SIGUSR1 arrives, and writes this rank's heartbeat file
// for `paratrain launch` every interval. A rank whose main thread is stuck in
// a blocking collective (Gloo waits inside the backend) still dumps and beats,
// because neither needs the main thread; a rank that is stopped (SIGSTOP) or
// dead does neither, which is exactly what the launcher's heartbeat monitor
// (launch/heartbeat_monitor.h) looks for. Not here: what the records mean
// (comm/doctor/dump_reader.h).
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <thread>

#include "paratrain/comm/doctor/flight_recorder.h"

namespace paratrain::comm {

/// How a DoctorWatchdog beats.
struct WatchdogOptions {
  /// The heartbeat file (`paratrain launch` passes PARATRAIN_HEARTBEAT_DIR and
  /// the file is <dir>/rank-<rank>.json). Empty: no heartbeats, SIGUSR1 dumps only.
  std::filesystem::path heartbeat_file;
  /// Time between beats; shorter notices a stopped rank sooner, at one small file write per beat.
  std::chrono::milliseconds interval{1000};
  /// Written into every beat: the launcher fails the job when no beat came for this long.
  std::chrono::milliseconds timeout{15000};
  /// Newest records copied into each beat: what the launcher saves as the
  /// doctor dump of a rank that stopped and cannot dump itself.
  std::size_t records_per_beat = 32;
};

/// Runs the watchdog thread from construction to destruction; installs a
/// SIGUSR1 handler (it only writes a byte to a pipe: async-signal-safe) and
/// restores the previous one at destruction. One per process at a time.
class DoctorWatchdog {
 public:
  /// `recorder`: this rank's, the one the heartbeats describe.
  DoctorWatchdog(std::shared_ptr<FlightRecorder> recorder, WatchdogOptions options);
  /// Writes a last beat that says "exiting" (the launcher stops watching
  /// this rank: a clean shutdown is not a hang), then stops the thread.
  ~DoctorWatchdog();
  DoctorWatchdog(const DoctorWatchdog&) = delete;
  DoctorWatchdog& operator=(const DoctorWatchdog&) = delete;

  /// Beats written so far.
  int64_t beats() const;

 private:
  void loop();
  void beat(const char* state);

  std::shared_ptr<FlightRecorder> recorder_;
  WatchdogOptions options_;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<int64_t> beats_{0};
  std::thread thread_;
};

/// Sets where `recorder` dumps (<doctor_dir>/rank-<rank>.json) and writes
/// <doctor_dir>/rank-<rank>.pid ("pid start-time host"), so that `paratrain
/// doctor --run RUN_DIR` can find this process and send it SIGUSR1 (the start
/// time tells it from a later process that reused the pid). Never throws.
void announce_doctor_dir(FlightRecorder& recorder, const std::filesystem::path& doctor_dir);

/// This process's start time in clock ticks since boot (/proc/<pid>/stat
/// field 22); 0 when unknown. With the pid it names one process for good.
long long process_start_ticks(long long pid);

}  // namespace paratrain::comm

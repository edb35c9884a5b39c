// The hang doctor's flight recorder: a rank's last N collectives (which group,
// which sequence number, which op, what tensor, when it started and ended) in
// a ring buffer, written out as JSON when something looks hung. Recording
// only: RecordingGroup (recording_group.h) feeds it, doctor_watchdog.h dumps
// it on SIGUSR1, and comm/doctor/dump_reader.h reads the dumps of every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace paratrain::comm {

/// Where a recorded collective stands.
enum class RecordState { kInFlight, kDone, kFailed, kTimedOut };
/// "in_flight", "done", "failed", "timed_out": the "state" field of a dump.
const char* to_string(RecordState state);

/// One collective as this rank saw it. No heap memory, so recording costs a
/// lock and a copy (see bench/doctor_overhead.cpp).
struct CollectiveRecord {
  uint64_t index = 0;     ///< position in this recorder's whole history (0, 1, ...)
  int group = -1;         ///< the recorder's group id (FlightRecorder::group_info)
  int64_t seq = 0;        ///< this group's collective count when issued: equal on every member for the same call
  const char* op = "";    ///< "all_reduce", "broadcast", ... (a string literal)
  int peer = -1;          ///< root, source or destination rank in the group; -1 when none
  const char* dtype = ""; ///< element type of the first tensor ("Float", ...), "" when none
  int64_t numel = 0;      ///< elements of the first tensor
  int ndim = 0;           ///< its dimensions (up to 4 kept in `shape`)
  int64_t shape[4] = {0, 0, 0, 0};  ///< its first 4 sizes
  int64_t start_us = 0;   ///< steady clock (CLOCK_MONOTONIC, shared by processes of one machine), microseconds
  int64_t end_us = -1;    ///< -1 while in flight (or when it failed before finishing)
  RecordState state = RecordState::kInFlight;  ///< see RecordState
};

/// A group as the recorder knows it.
struct RecordedGroup {
  std::string name;          ///< "world", "dp", "tp", ... or "group" when nobody named it
  std::vector<int> ranks;    ///< global ranks of the members, by rank in the group
  int instance = 0;          ///< earlier groups of this rank with the same ranks: tells twins apart
  int64_t next_seq = 0;      ///< collectives issued on it so far
};

/// One rank's ring buffer. Thread-safe: collectives may be issued from
/// several threads (autograd hooks, the pipeline executor).
class FlightRecorder {
 public:
  /// `global_rank`: whose records these are; `capacity`: records kept (N >= 1).
  FlightRecorder(int global_rank, std::size_t capacity);

  int rank() const { return rank_; }  ///< the global rank given at construction
  std::size_t capacity() const { return ring_.size(); }  ///< N

  /// Registers a group and returns its id.
  int add_group(std::string name, std::vector<int> global_ranks);
  /// Renames group `id` (the device mesh names its axes).
  void rename_group(int id, std::string name);

  /// Records the start of `op` on group `id` and returns its ticket for
  /// finish(). `tensor` may be null or undefined (barrier).
  uint64_t begin(int id, const char* op, const at::Tensor* tensor, int peer);
  /// Marks the record of `ticket` as ended at `end_us` (a steady-clock time
  /// in microseconds) with `state`; nothing when it already left the ring.
  /// A record already done stays done.
  void finish(uint64_t ticket, RecordState state, int64_t end_us);

  /// Copies of the records still in the ring, oldest first.
  std::vector<CollectiveRecord> records() const;
  /// Copies of the groups, indexed by id.
  std::vector<RecordedGroup> groups() const;

  /// The dump document: {"rank", "pid", "reason", "dumped_at_us", "groups",
  /// "records", "last_op"}; at most `last` records (0 = all), newest last.
  /// One field per line at the top level (the launcher reads "last_op" without
  /// a JSON parser: launch/heartbeat_monitor.h).
  std::string to_json(const std::string& reason, std::size_t last = 0,
                      const std::string& extra_fields = "") const;
  /// One line about what this rank is doing: its oldest collective still in
  /// flight (what it is stuck in), else its newest one; "no collective yet".
  std::string last_op() const;

  /// Where dump() writes: <dir>/rank-<rank>.json. Empty (the default): dump() does nothing.
  void set_dump_dir(const std::filesystem::path& dir);
  std::filesystem::path dump_dir() const;  ///< see set_dump_dir
  /// Writes the dump atomically (temporary file + rename) and returns its
  /// path; empty when no dump dir is set. Never throws: a failed write is
  /// logged (a dump is a diagnosis, never a reason to fail a job).
  std::filesystem::path dump(const std::string& reason) const;

  /// Why a watcher aborted this rank's groups (comm/peer_watch.h: a peer's
  /// heartbeats stopped). RecordingGroup puts it in front of the CommError of
  /// every operation that fails afterwards, so the collective that was
  /// blocked fails naming the cause, not just "group aborted". Empty: none.
  void set_abort_reason(std::string reason);
  std::string abort_reason() const;  ///< see set_abort_reason

  /// The steady clock in microseconds, as start_us/end_us use it.
  static int64_t now_us();

 private:
  std::string describe(const CollectiveRecord& r) const;  // caller holds mu_

  int rank_;
  mutable std::mutex mu_;
  std::vector<CollectiveRecord> ring_;
  uint64_t total_ = 0;  // records ever begun; the next index
  std::vector<RecordedGroup> groups_;
  std::filesystem::path dump_dir_;
  std::string abort_reason_;
};

/// Every live recorder of this process (one per rank; tests run several
/// ranks as threads). Recorders register themselves when built with
/// register_recorder and leave when destroyed.
void register_recorder(const std::shared_ptr<FlightRecorder>& recorder);
/// Live recorders, in registration order.
std::vector<std::shared_ptr<FlightRecorder>> live_recorders();

}  // namespace paratrain::comm

// The hang doctor's diagnosis: reads every rank's dump (<run_dir>/doctor/
// rank-<r>.json, written by comm/doctor/flight_recorder.h), finds the rank that is
// behind and the collective where the ranks diverged, and draws the last
// seconds as a Chrome trace. Pure reading and analysis; sending SIGUSR1 and
// waiting for fresh dumps is the CLI's (`paratrain doctor`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace paratrain::comm {

/// One collective in a dump.
struct DumpRecord {
  int group = -1;              ///< id into RankDump::groups
  int64_t seq = 0;             ///< the group's sequence number
  std::string op;              ///< "all_reduce", ...
  int peer = -1;               ///< root / source / destination in the group; -1 none
  std::string dtype;           ///< "Float", ... ("" without a tensor)
  std::vector<int64_t> shape;  ///< up to the first 4 sizes
  int64_t numel = 0;           ///< elements of the tensor
  int64_t start_us = 0;        ///< steady clock, microseconds
  int64_t end_us = -1;         ///< -1 while in flight or after a failure
  std::string state;           ///< "in_flight", "done", "failed", "timed_out"
};

/// A group in a dump.
struct DumpGroup {
  std::string name;        ///< "world", "dp", ...
  std::vector<int> ranks;  ///< global ranks of the members
  int instance = 0;        ///< tells apart groups of one rank with the same members
  int64_t next_seq = 0;    ///< collectives issued on it
};

/// One rank's dump.
struct RankDump {
  int rank = -1;                    ///< global rank
  long long pid = 0;                ///< its process
  std::string host;                 ///< its host
  std::string reason;               ///< "SIGUSR1", "collective timeout", "heartbeat", ...
  int64_t dumped_at_us = 0;         ///< steady clock at the dump
  std::string last_op;              ///< the rank's own one-line summary
  std::vector<DumpGroup> groups;    ///< by id
  std::vector<DumpRecord> records;  ///< oldest first
};

/// Parses one dump document; throws Error naming `where` on a malformed one.
RankDump parse_dump(const nlohmann::json& doc, const std::string& where);
/// Every <dir>/rank-<r>.json, by rank. Throws Error when there is none (saying how to get them).
std::vector<RankDump> read_dumps(const std::filesystem::path& doctor_dir);

/// Where the members of one group stand against each other.
struct GroupVerdict {
  std::string group;          ///< "world [0,1,2]"
  std::vector<int> behind;    ///< global ranks that issued fewer collectives than the others
  std::vector<int> ahead;     ///< the ranks that issued the most
  std::vector<int> missing;   ///< members without a dump
  int64_t mismatch_seq = -1;  ///< first sequence number where members issued different ops; -1 none
  std::string message;        ///< one human sentence; empty when the group agrees
};

/// The doctor's findings.
struct DoctorReport {
  std::vector<GroupVerdict> groups;  ///< one per group that diverged or lacks a dump
  std::vector<std::string> lines;    ///< what `paratrain doctor` prints
  bool diverged = false;             ///< some rank is behind, or ops mismatch
  std::string text() const;          ///< lines joined by newlines
};

/// Compares the ranks' sequence numbers group by group (Note [Finding the
/// rank behind] in doctor.cpp). `world_size` > 0 names ranks without a dump;
/// 0 takes the members of the groups seen. A rank counts as behind only when
/// a peer had waited at least `min_lag_s` in the collective it lacks when it
/// dumped (Note [Dumps are not simultaneous]): in a healthy job one rank is
/// always a step's compute behind for an instant.
DoctorReport diagnose(const std::vector<RankDump>& dumps, int world_size = 0, double min_lag_s = 1.0);

/// The records of the last `seconds` before the newest dump as a Chrome trace
/// (chrome://tracing, ui.perfetto.dev): one row per rank, one slice per
/// collective named "all_reduce #12 (dp)"; collectives still in flight end at
/// their rank's dump time and are marked {"state": "in_flight"}.
nlohmann::json doctor_trace(const std::vector<RankDump>& dumps, double seconds = 10.0);

}  // namespace paratrain::comm

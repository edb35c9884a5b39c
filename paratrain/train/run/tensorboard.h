// TensorBoard scalar logs without TensorFlow: event files written from the
// published formats, and a reader that checks them (tests, tools). Not a
// protobuf library: only the few Event/Summary fields scalars need.
//
// Format facts (TensorFlow's record_writer and event.proto/summary.proto):
// a file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// little-endian, masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, CRC-32C
// (Castagnoli). Each data is an Event: wall_time = 1 (double),
// step = 2 (int64), file_version = 3 (string, "brain.Event:2" in the first
// record), summary = 5 (Summary: repeated Value value = 1; Value: tag = 1
// (string), simple_value = 2 (float)).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "paratrain/train/callbacks.h"

namespace paratrain::train {

// CRC-32C (Castagnoli, reflected, init and final xor ~0): "123456789" -> 0xE3069283.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host>.<pid> and writes the
  // file_version record. Throws Error naming the file when it cannot.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time);
  // Records are flushed to the OS after each add, so a crash keeps them.
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::filesystem::path path_;
  std::ofstream out_;
};

struct ScalarEvent {
  std::string tag;
  double value = 0;  // stored as float32, as TensorBoard's simple_value is
  int64_t step = 0;
  double wall_time = 0;
};

// Every scalar in an event file, in order. Throws Error naming the file and
// the record when a length or data CRC does not verify, a record is cut
// short, or an Event does not parse.
std::vector<ScalarEvent> read_scalar_events(const std::filesystem::path& file);

// The event files under `dir`, sorted by name.
std::vector<std::filesystem::path> list_event_files(const std::filesystem::path& dir);

// log.tensorboard: every numeric field of every metrics.jsonl record as a
// scalar "<kind>/<field>" (train/loss, train/lr, train/samples_per_s,
// eval/test_accuracy, ...) at the record's step, and a {"kind": "moe"}
// record's per-layer counts as moe/<layer>/<field>[/<expert>]. Rank 0 writes; the files go
// to <run_dir>/tensorboard/ (point `tensorboard --logdir` at the run folder).
class TensorBoardLogger : public Callback {
 public:
  void on_fit_start(const FitInfo& fit) override;
  void on_log(const nlohmann::json& record) override;

 private:
  std::unique_ptr<TensorBoardWriter> writer_;
};

}  // namespace paratrain::train

// Where training reports go: one JSON object per line in
// runs/<name>/metrics.jsonl (plots and tools read it), and the human
// progress line. Written by rank 0 only; values are already reduced.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace paratrain::train {

class MetricsLog {
 public:
  // Appends to `path` (a resumed run continues the same file). An empty
  // path makes a log that drops everything (ranks other than 0).
  explicit MetricsLog(const std::filesystem::path& path);
  // Adds "time" (seconds since the epoch) unless the record has it, and writes one line, flushed so a
  // crash loses at most the line being written.
  void write(nlohmann::json record);

 private:
  std::ofstream out_;
};

// "1h02m", "3m07s", "12s": the ETA in the progress line.
std::string format_duration(double seconds);

}  // namespace paratrain::train

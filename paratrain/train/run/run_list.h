// `paratrain runs [DIR]`: what runs a folder holds, one row per version,
// with status, steps, the best evaluation and the checkpoint count, read
// from run.json, metrics.jsonl and checkpoints/. Not the run layout
// (run_dir.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace paratrain::train {

struct RunSummary {
  std::string name;                 // run.name
  std::optional<int64_t> version;   // none for a folder of the layout before versions
  std::filesystem::path dir;
  // "running", "finished", "failed", "stopped" (by a signal, with its name
  // in run.json), "died" (running per run.json but its
  // process is gone on this host), or "unknown" (no run.json).
  std::string status;
  int64_t steps = 0;
  int64_t checkpoints = 0;
  std::string metric;               // the best value's metric ("" when never evaluated)
  double best = 0;
  double started = 0;               // seconds since the epoch (0 = unknown)
};

// Every run version under `root` (e.g. runs/), sorted by name then version.
std::vector<RunSummary> list_runs(const std::filesystem::path& root);

// The table `paratrain runs` prints.
std::string format_runs(const std::vector<RunSummary>& runs);

}  // namespace paratrain::train

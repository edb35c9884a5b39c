// Run directories: every run of a config gets its own version folder,
// <output_dir>/<name>/version_N (as Lightning's loggers do), so re-running a
// config starts version N+1 instead of refusing; train.resume = "auto"
// continues the newest version. Also the run's status file (run.json) that
// `paratrain runs` reads. Not the checkpoint layout inside a version
// (checkpoint/checkpoint_files.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/train/config/config.h"

namespace paratrain::train {

// "version_3" -> 3; nullopt for any other name.
std::optional<int64_t> parse_version_name(const std::string& name);

// The version numbers under <root> (= <output_dir>/<name>), ascending.
std::vector<int64_t> list_versions(const std::filesystem::path& root);

// Picks and creates the run's folder (with its checkpoints/ inside). Call on
// one rank only (rank 0) and pass the result to the others:
// - run.version >= 0: exactly version_<run.version>;
// - train.resume = "auto": the newest version holding a committed checkpoint
//   (a version without one never hides an older one's; Note [Resuming the
//   newest version with a checkpoint] in the .cpp), else the newest version
//   (version_0 if none);
// - otherwise a new version, one above the newest; a version folder another
//   job created at the same moment is skipped (creation is atomic).
// Throws ConfigError when the folder cannot be created.
std::filesystem::path create_run_dir(const TrainConfig& config);

// <root>/version_<version>.
std::filesystem::path version_dir(const std::filesystem::path& root, int64_t version);

// For tools given a path by a user (plot, trace, runs): a version folder as
// it is; a run folder holding version_N folders -> its newest version; any
// other path unchanged (the caller reports what is missing).
std::filesystem::path resolve_run_dir(const std::filesystem::path& given);

// <run_dir>/run.json, written atomically by rank 0: {"status": "running" |
// "finished" | "failed" | "stopped" (by a signal: "signal"), "host", "pid", "started", "ended", "steps",
// "total_steps", "error", ...}. `update` is merged into what is there.
void update_run_status(const std::filesystem::path& run_dir, const nlohmann::json& update);
// Seconds since the Unix epoch: how run.json records "started" and "ended".
double unix_time();

}  // namespace paratrain::train

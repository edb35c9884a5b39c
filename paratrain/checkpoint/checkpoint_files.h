// Checkpoints in a run folder: where each step's checkpoint goes, which ones a
// resume may use (newest first, skipping damaged ones with the reason logged),
// cleaning up interrupted writes, pruning old ones. Formats are elsewhere:
// sharded.h (directories), checkpoint.h (single files).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

namespace paratrain::checkpoint {

// <run_dir>/checkpoints/step_<8 digits>/ : a sharded checkpoint directory
// (save_sharded_checkpoint). Committed once it holds index.json.
std::filesystem::path checkpoint_dir(const std::filesystem::path& run_dir, int64_t step);

// <run_dir>/checkpoints/step_<8 digits>.safetensors : the single-file format
// (save_checkpoint). Still listed, loaded and pruned beside directories.
std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir, int64_t step);

struct CheckpointEntry {
  int64_t step = 0;
  std::filesystem::path path;  // a directory when `sharded`, else a file
  bool sharded = false;
  // False for a step directory this process may not look into (listed all the
  // same, see list_checkpoints): nothing may delete it.
  bool readable = true;
};

// Committed checkpoints, not validated: step directories holding index.json
// and step_N.safetensors files; highest step first (a directory before a file
// of the same step). Directories without index.json (interrupted saves) and
// `*.tmp.*` files never appear; a step directory this process may not look
// into does, since it may be committed (reading it then throws
// CheckpointAccessError, checkpoint_access.h).
std::vector<CheckpointEntry> list_checkpoints(const std::filesystem::path& run_dir);

// Cheap checks, no tensor data read: a directory's index parses and validates
// (coverage, metadata values) and every shard exists with the recorded size; a
// file's header, size and metadata check out. Throws CheckpointError with the
// reason. Checksums are verified at load, which can still fail.
void check_checkpoint(const std::filesystem::path& checkpoint);

// list_checkpoints filtered by check_checkpoint, highest step first; each
// skipped one is logged (warning) with its reason. One that cannot be read
// for lack of permission is not skipped: CheckpointAccessError. `train.resume = "auto"`
// tries these in order and falls back to the next when a load still fails
// (say, a checksum mismatch), logging which one it skipped.
std::vector<std::filesystem::path> find_loadable_checkpoints(const std::filesystem::path& run_dir);

// The first of find_loadable_checkpoints; nullopt when none.
std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& run_dir);

// Removes what interrupted saves left in <run_dir>/checkpoints: `*.tmp.*`
// files (also inside step directories) and step directories without
// index.json. A step directory it may not look into, or a folder it cannot
// list, is left alone with a warning (never delete what could not be read).
// Returns how many entries went; logs each. Call it before
// training starts, on one rank (rank 0), while no other process writes to the
// run folder: an in-progress save looks exactly like an interrupted one.
int clean_interrupted_checkpoints(const std::filesystem::path& run_dir);

// Deletes all but the `keep` highest-step committed checkpoints (whole
// directories, or files); keep <= 0 keeps all (train.keep_checkpoints = 0).
// One this process may not read is never deleted (a warning names it).
// Returns how many went. Call it on one rank after a save has committed.
int prune_checkpoints(const std::filesystem::path& run_dir, int64_t keep);

}  // namespace paratrain::checkpoint

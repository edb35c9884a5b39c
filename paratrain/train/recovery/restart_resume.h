// Which run a restarted worker continues (`paratrain launch --max-restarts`,
// torchrun --max-restarts): the run version its first generation created, from
// that version's latest complete checkpoint. A policy over config overrides
// and run.json; not the restart itself (launch/launcher.cpp) nor the loading
// of a checkpoint (resume_run.cpp). See Note [Restarting workers] there.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/train/config/config.h"

namespace paratrain::train {

// The key in run.json that names the launch a run version belongs to.
inline constexpr const char* kLaunchIdKey = "launch_id";

struct RestartResume {
  // Appended to the user's --set overrides (so they win): "train.resume=...",
  // and "run.version=N" when this launch's version was found.
  std::vector<std::string> overrides;
  // One line for the log: what is continued and why.
  std::string message;
};

// For a worker of generation `restart_count` > 0 of the launch `launch_id`
// (PARATRAIN_LAUNCH_ID from `paratrain launch`, else TORCHELASTIC_RUN_ID;
// empty or "none" when unknown), given the config as the user wrote it:
// - run.version >= 0: that version, train.resume = "auto";
// - else the newest version whose run.json records `launch_id` (written by
//   the first generation, see record_launch_id): that version, resume "auto",
//   unless it holds no complete checkpoint yet and the user resumed from a
//   path, which is then kept (the run began from it);
// - no version records it (generation 0 died before its Trainer made one):
//   nothing to continue, the config as written (a new version);
// - no usable launch id: train.resume = "auto", the newest version, which is
//   this launch's unless another job of the same run.name started since.
RestartResume restart_resume(const TrainConfig& config, const std::string& launch_id, int restart_count);

// Records `launch_id` in <run_dir>/run.json; call on rank 0 once the Trainer
// made the run folder. Does nothing for an empty or "none" id. With
// world_size > 0 it also records it as the run's starting world size
// (kStartWorldSizeKey), once: later generations keep the first's.
void record_launch_id(const std::filesystem::path& run_dir, const std::string& launch_id, int world_size = 0);

// The key in run.json that holds the world size the run started with.
inline constexpr const char* kStartWorldSizeKey = "start_world_size";

// elastic.keep_global_batch (Note [Keeping the global batch] in the .cpp):
// for a worker about to continue `run_dir` at `world_size` ranks, the
// overrides that keep the global batch the run started with, and a log line
// saying what changed. Nothing when the option is off, the run has no
// recorded start, or nothing needs to change. Throws ConfigError naming
// elastic.keep_global_batch and the sizes when neither the per-rank batch
// nor train.accumulate can make the starting global batch.
RestartResume keep_global_batch(const TrainConfig& config, const std::filesystem::path& run_dir, int world_size);

// The run version `plan` (from restart_resume) continues, or nullopt.
std::optional<std::filesystem::path> continued_run_dir(const TrainConfig& config, const RestartResume& plan);

}  // namespace paratrain::train

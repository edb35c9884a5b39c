// One try at loading a training checkpoint into the run, told apart as
// loaded, not allowed to be read (Note [Unreadable is not damaged] in
// checkpoint/checkpoint_access.cpp) or damaged. Shared by where a run starts
// (resume_run.cpp) and the in-job rollback (in_job_rollback.cpp), which then
// agree with the other ranks on the verdict each in its own way.
// Internal to paratrain/train.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "paratrain/train/checkpointing.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

struct LoadAttempt {
  std::optional<LoopPosition> position;  ///< set when this rank loaded it
  std::string error;                     ///< why not (empty when loaded)
  bool denied = false;                   ///< not allowed to read: not damaged
};

/// Loads `path` into the strategy, optimizer and scaler of `s` (this rank
/// only; no collective). Non-finite parameters or state count as damaged.
LoadAttempt try_load_training_checkpoint(const std::filesystem::path& path, Trainer::State& s);

}  // namespace paratrain::train

// The Trainer's use of checkpoints: where they go in the run directory,
// which one `train.resume` means, and the loop position stored with them.
// The format (one safetensors file per rank plus index.json, re-cut to any
// layout on load) lives in checkpoint/; what each rank holds comes from
// the strategy's slots (strategy.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/strategies/strategy.h"

namespace torch::optim {
class Optimizer;
}
namespace paratrain::optim {
class GradScaler;
}

namespace paratrain::checkpoint {
class AsyncCheckpointSaver;
}  // namespace paratrain::checkpoint

namespace paratrain::train {

// Where the loop stood when the checkpoint was taken: `step` optimizer steps
// done; the loader will continue at batch `next_batch` of `epoch`.
struct LoopPosition {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t next_batch = 0;
  // The positions of the epoch's permutation trained so far, which a resume
  // continues from at any world size (Note [Resuming at another world size]
  // in resume_run.cpp; after an in-job recovery next_batch counts batches of the
  // survivors' split, train/recovery/in_job.h). Saved as the checkpoint's
  // "loader.consumed_positions" when > 0.
  int64_t consumed_positions = 0;
  // data.batch_shares: each dp rank's micro-batch size when the checkpoint
  // was taken ("loader.batch_shares"; empty without shares). A resume with
  // "auto" at the same dp size and batch continues with them.
  std::vector<int64_t> batch_shares;
};

// Collective over `world`: writes <run_dir>/checkpoints/step_<step>/ (a file
// per rank, index.json last) and returns its path. Model and optimizer state
// as the strategy holds them, the position, RNG state, the config, the
// strategy's layout and the data preprocessing, and the loss scaler's scale
// and growth count when there is one (the same on every rank).
std::filesystem::path save_training_checkpoint(const std::filesystem::path& run_dir, const TrainConfig& config,
                                               comm::ProcessGroup& world, Strategy& strategy,
                                               torch::optim::Optimizer& optimizer, const LoopPosition& position,
                                               const optim::GradScaler* scaler = nullptr);

// A checkpoint that is complete on disk (its index.json written).
struct SavedCheckpoint {
  std::filesystem::path dir;
  int64_t step = 0;
  std::string why;  // "periodic", "end of epoch 2", ... for the log
};

// The Trainer's saves: synchronous, or with train.async_checkpoint in the
// background (checkpoint/async_saver.h), where a save returns once this
// rank's state is copied and the files are written while training goes on.
class TrainingCheckpointer {
 public:
  // Collective over `world` when config.train.async_checkpoint (it builds the
  // writer's own group).
  TrainingCheckpointer(const TrainConfig& config, comm::ProcessGroup& world);
  // Waits for a background save in flight (its error is logged).
  ~TrainingCheckpointer();

  // Collective. Saves the checkpoint of `position` (save_training_checkpoint's
  // contents). Returns the checkpoint this call saw committed: the one it
  // wrote (synchronous), or the previous background save, which it waited for
  // before starting this one (nullopt when there was none). Errors of a
  // background save surface here or in finish(), on every rank.
  std::optional<SavedCheckpoint> save(const std::filesystem::path& run_dir, const TrainConfig& config,
                                      Strategy& strategy, torch::optim::Optimizer& optimizer,
                                      const LoopPosition& position, const optim::GradScaler* scaler,
                                      std::string why);
  // Collective. Waits for the background save in flight and returns it.
  std::optional<SavedCheckpoint> finish();

 private:
  comm::ProcessGroup& world_;
  std::unique_ptr<checkpoint::AsyncCheckpointSaver> async_;
  std::optional<SavedCheckpoint> in_flight_;
};

// Fills the strategy's slots and the optimizer state from `path` (saved at
// any layout), calls strategy.after_load(), restores `scaler` when the
// checkpoint has its state (one saved without a scaler leaves it at its
// configured initial scale), returns the position. Throws CheckpointError
// naming the file and what does not match.
LoopPosition load_training_checkpoint(const std::filesystem::path& path, Strategy& strategy,
                                      torch::optim::Optimizer& optimizer, optim::GradScaler* scaler = nullptr);

// train.resume: "" -> none; "auto" -> every complete checkpoint of the run
// dir, newest first (the caller falls back to older ones when one fails to
// load); otherwise that path, which must exist.
std::vector<std::filesystem::path> resume_candidates(const TrainConfig& config, const std::filesystem::path& run_dir);

// Renames an unloadable checkpoint directory to `<name>.unreadable` (or
// `.unreadable.<n>`), so no listing picks it and no later save overwrites it.
void quarantine_checkpoint(const std::filesystem::path& path);


// Data preprocessing the model expects, recorded in checkpoints so weights
// used elsewhere see the same inputs ("data.normalize" -> "(x/255 - 0.286) / 0.353").
std::vector<std::pair<std::string, std::string>> preprocessing_metadata(const TrainConfig& config);

}  // namespace paratrain::train

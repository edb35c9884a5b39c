// The Trainer's use of checkpoints: where they go in the run directory,
// which one `train.resume` means, and the loop position stored with them.
// The file format and tensor bookkeeping live in train/checkpoint/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "paratrain/train/config.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace paratrain::train {

// Where the loop stood when the checkpoint was taken: `step` optimizer steps
// done; the loader will continue at batch `next_batch` of `epoch`.
struct LoopPosition {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t next_batch = 0;
};

// Writes <run_dir>/checkpoints/step_<step>.safetensors atomically and returns
// its path. Model, optimizer state, position, RNG state and the config.
std::filesystem::path save_training_checkpoint(const std::filesystem::path& run_dir, const TrainConfig& config,
                                               torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                               const LoopPosition& position);

// Restores model, optimizer and RNG in place; returns the position. Throws
// CheckpointError naming the file and what does not match.
LoopPosition load_training_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                                      torch::optim::Optimizer& optimizer);

// train.resume: "" -> no resume (empty path); "auto" -> the latest checkpoint
// in the run dir (empty if none); otherwise that file, which must exist.
std::filesystem::path resolve_resume(const TrainConfig& config, const std::filesystem::path& run_dir);

// Writes text through a temporary file and rename, so readers never see a
// half-written file.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace paratrain::train

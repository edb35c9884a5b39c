// Training checkpoints: model parameters and buffers, optimizer state keyed by
// parameter name, loop position, RNG state and the config, in one safetensors
// file. Saving is atomic (see safetensors.h); loading restores in place and
// refuses a checkpoint whose tensor names or shapes do not match the model.
// One file written by one process: the sharded format (each rank its
// pieces, any layout back) is sharded.h; consolidate_checkpoint turns it into
// this one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace paratrain::checkpoint {

// Everything in a checkpoint that is not a model or optimizer tensor.
struct TrainingState {
  int64_t step = 0;            // optimizer steps taken so far
  int64_t epoch = 0;           // epoch to resume in
  int64_t batch_in_epoch = 0;  // batches of `epoch` already consumed
  uint64_t sampler_seed = 0;   // the DistributedSampler's base seed
  nlohmann::json config;       // to_json(TrainConfig) of the run that saved it
  // Free-form string metadata for strategies to add (world size, layout, ...).
  std::map<std::string, std::string> extra;
  // Filled by load_sharded_checkpoint: the CheckpointContents::strategy_state slots
  // the checkpoint lacks (or holds at another shape or dtype), left untouched.
  std::vector<std::string> missing_state;
};

struct SaveCheckpointOptions {
  // Save torch's default CPU generator so dropout/init after resuming draw
  // the same numbers as an uninterrupted run.
  bool save_rng = true;
  // fsync file and folder (see SafetensorsWriteOptions::sync).
  bool sync = true;
};

struct LoadCheckpointOptions {
  // Restore the default CPU generator if the checkpoint has its state.
  bool restore_rng = true;
};

// Writes `<path>` atomically. Supported optimizers: torch::optim::SGD, Adam,
// AdamW (others throw CheckpointError). Every optimizer parameter must belong
// to `model` (its name is the key of its state).
void save_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const TrainingState& state,
                     const SaveCheckpointOptions& options = {});

// Restores parameters and buffers (in place: optimizers holding them stay
// valid), the optimizer state and the RNG, and returns the TrainingState.
// Throws CheckpointError naming the tensor on any missing, extra or
// mis-shaped tensor, or when the optimizer kind differs from the saved one.
TrainingState load_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer,
                              const LoadCheckpointOptions& options = {});

// Only the model's parameters and buffers (evaluation, fine-tuning).
TrainingState load_model_weights(const std::filesystem::path& path, torch::nn::Module& model);

}  // namespace paratrain::checkpoint

// Run-folder helpers (checkpoint_path, find_latest_checkpoint, ...) used to be
// declared here; kept reachable for existing includes.
#include "paratrain/checkpoint/checkpoint_files.h"

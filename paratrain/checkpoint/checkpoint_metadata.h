// Internal to paratrain/checkpoint: the names and metadata shared by the single-file
// format (checkpoint.cpp) and the sharded one (sharded_*.cpp), so a
// consolidated sharded checkpoint is byte-for-byte the single-file layout.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint.h"

namespace paratrain::checkpoint {

inline constexpr std::string_view kCheckpointFormat = "paratrain-checkpoint/1";
inline constexpr std::string_view kModelPrefix = "model/";
inline constexpr std::string_view kOptimizerPrefix = "optimizer/";
inline constexpr std::string_view kRngKey = "rng/cpu";
inline constexpr std::string_view kStatePrefix = "state/";

struct OptimizerStateIo;

// format, step, epoch, batch_in_epoch, sampler_seed, config, torch_version,
// extra.*; plus optimizer and optimizer_options when `io` is given.
std::map<std::string, std::string> training_metadata(const TrainingState& state, const OptimizerStateIo* io,
                                                     const torch::optim::Optimizer* optimizer);

// The inverse; throws CheckpointError naming `file` and the bad key, so a
// corrupt value is a reason to skip a checkpoint, not a crash.
TrainingState training_state_from_metadata(const std::map<std::string, std::string>& metadata,
                                           const std::string& file);

// Throws CheckpointError unless metadata "optimizer" equals io.kind.
void check_optimizer_kind(const std::map<std::string, std::string>& metadata, const OptimizerStateIo& io,
                          const std::string& file);

}  // namespace paratrain::checkpoint

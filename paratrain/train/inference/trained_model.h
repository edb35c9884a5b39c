// A trained model out of a checkpoint, for inference (docs/quantization.md):
// `paratrain evaluate` and `paratrain quantize` use it. The model's
// architecture is the config saved in the checkpoint's metadata; its weights
// are the checkpoint's, from any layout (a sharded folder or a consolidated
// file), or an int8 file written by quantize_checkpoint, dequantized.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/quant/quantize.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train {

/// Metadata key and value that mark an int8 file.
inline constexpr const char* kQuantFormatKey = "quant.format";
inline constexpr const char* kQuantFormat = "paratrain-int8-v1";

/// A model ready to run: eval mode, on the CPU.
struct TrainedModel {
  TrainConfig config;                     ///< the run's config, from the checkpoint
  std::shared_ptr<models::Model> model;
  bool quantized = false;                 ///< read from an int8 file (its weights dequantized)
  int bits = 32;                          ///< the integer weights' bits (quant.bits) when quantized
  int64_t step = 0;                       ///< the training step the checkpoint was taken at
};

/// Loads `checkpoint`. ConfigError when it holds no config (a checkpoint of a
/// program's own model); CheckpointError naming a tensor that is missing,
/// mismatched or damaged (a quantized weight without its scales too).
TrainedModel load_trained_model(const std::filesystem::path& checkpoint);

/// How quantize_checkpoint quantizes.
struct QuantizeOptions {
  /// 2 to 8 (stored as int8); 0: the run's quant.weight_bits when it trained
  /// with quant.qat (the ranges it learned to live with), else 8.
  int bits = 0;
  quant::Granularity granularity = quant::Granularity::kPerChannel;
};

/// What quantize_checkpoint wrote.
struct QuantizeReport {
  int bits = 8;                        ///< the bits used
  std::vector<std::string> quantized;  ///< parameters stored as integers (Linear and Conv weights)
  int64_t float_bytes = 0;             ///< the model's parameters and buffers in float32
  int64_t file_bytes = 0;              ///< the same in the int8 file (values, scales, the rest as float32)
};

/// Note [The int8 file]
/// One safetensors file: every Linear and Conv2d weight as "model/<name>"
/// (I8, the original shape) with its float32 scales as "scale/<name>" ([C]
/// per output channel or [1] per tensor: Note [Symmetric quantization] in
/// quant/quantize.h); every other parameter and buffer as "model/<name>" in
/// float32, as a consolidated checkpoint holds it; no optimizer state. Its
/// metadata is the checkpoint's (the config, the step, the data
/// preprocessing) plus "quant.format" = "paratrain-int8-v1", "quant.bits",
/// "quant.granularity" ("per_channel" | "per_tensor").
QuantizeReport quantize_checkpoint(const std::filesystem::path& checkpoint, const std::filesystem::path& out,
                                   const QuantizeOptions& options = {});

/// The task's metrics (task_for_config) of `model` on the test split of its
/// config's data, in one process: what Trainer::evaluate reports for it.
EvalResult evaluate_trained_model(const TrainedModel& trained);

}  // namespace paratrain::train

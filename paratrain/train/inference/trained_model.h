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
  /// How the Linear and Conv2d inputs are quantized when it runs (an int8
  /// file's quant.activations): "none", "dynamic" or "static"; a float
  /// checkpoint runs as it trained ("none", or a QAT run's own fake
  /// quantization).
  std::string activations = "none";
  int activation_bits = 0;                ///< their bits (0 with "none")
  /// What runs the matmuls: "float32" (a float checkpoint), "simulated"
  /// (float32 on dequantized weights and fake-quantized activations) or
  /// "int8 Linear (onednn)" (Note [Int8 kernels] in quant/int8_kernels.h).
  std::string kernels = "float32";
  int64_t step = 0;                       ///< the training step the checkpoint was taken at
};

/// How load_trained_model runs an int8 file.
struct LoadOptions {
  /// A file with 8-bit weights and dynamic activations runs its Linears on
  /// LibTorch's int8 kernels when it has them (Note [Int8 kernels]); off:
  /// simulated.
  bool int8_kernels = true;
};

/// Loads `checkpoint`. ConfigError when it holds no config (a checkpoint of a
/// program's own model); CheckpointError naming a tensor that is missing,
/// mismatched or damaged (a quantized weight without its scales too).
TrainedModel load_trained_model(const std::filesystem::path& checkpoint, const LoadOptions& options = {});

/// How quantize_checkpoint quantizes.
struct QuantizeOptions {
  /// 2 to 8 (stored as int8); 0: the run's quant.weight_bits when it trained
  /// with quant.qat (the ranges it learned to live with), else 8.
  int bits = 0;
  quant::Granularity granularity = quant::Granularity::kPerChannel;
  /// The activations (Note [The int8 file]): "none" (float), "dynamic"
  /// (each input's own per-tensor range, at run time) or "static" (ranges
  /// fixed in the file). "" = the default: "static" with the learned ranges
  /// of a QAT run with quant.activation_bits, "none" for a QAT run without,
  /// else "static" when calibrate > 0 and "dynamic" otherwise.
  std::string activations;
  /// Static ranges of a float run: the min and max of each layer's inputs
  /// over this many batches of the training split (in order, the run's
  /// per-rank batch size, its preprocessing). 0 with "static" is an error.
  int64_t calibrate = 0;
  /// Bits of quantized activations, 2 to 8; 0: 8, or a QAT run's
  /// quant.activation_bits (which another value contradicts: ConfigError).
  int activation_bits = 0;
};

/// What quantize_checkpoint wrote.
struct QuantizeReport {
  int bits = 8;                        ///< the bits used
  std::vector<std::string> quantized;  ///< parameters stored as integers (Linear and Conv weights)
  int64_t float_bytes = 0;             ///< the model's parameters and buffers in float32
  int64_t file_bytes = 0;              ///< the same in the int8 file (values, scales, the rest as float32)
  std::string activations = "none";    ///< the activation mode written
  int activation_bits = 0;             ///< their bits (0 with "none")
  int64_t calibrated_batches = 0;      ///< batches the static ranges were measured on (0: learned or none)
};

/// Note [The int8 file]
/// One safetensors file: every Linear and Conv2d weight as "model/<name>"
/// (I8, the original shape) with its float32 scales as "scale/<name>" ([C]
/// per output channel or [1] per tensor: Note [Symmetric quantization] in
/// quant/quantize.h); every other parameter and buffer as "model/<name>" in
/// float32, as a consolidated checkpoint holds it; no optimizer state. Its
/// metadata is the checkpoint's (the config, the step, the data
/// preprocessing) plus "quant.format" = "paratrain-int8-v1", "quant.bits",
/// "quant.granularity" ("per_channel" | "per_tensor"), "quant.activations"
/// ("none" | "dynamic" | "static") and "quant.activation_bits". With static
/// activations each quantized layer's input range is "act_range/<layer>"
/// (F32 [2]: min, max; the grid is quant::activation_grid's: [0, 2^b - 1]
/// for a nonnegative range, symmetric otherwise). A file without
/// "quant.activations" (written before it existed) runs with float
/// activations.
QuantizeReport quantize_checkpoint(const std::filesystem::path& checkpoint, const std::filesystem::path& out,
                                   const QuantizeOptions& options = {});

/// The task's metrics (task_for_config) of `model` on the test split of its
/// config's data, in one process: what Trainer::evaluate reports for it.
EvalResult evaluate_trained_model(const TrainedModel& trained);

}  // namespace paratrain::train

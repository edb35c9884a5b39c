// Text generation from a trained GPT: load the model of a run's checkpoint
// and sample byte tokens autoregressively (temperature, top-k). Behind
// `paratrain generate`; a library so tests can drive it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "paratrain/train/config/config.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train {

struct SamplingOptions {
  int64_t tokens = 200;      // bytes to generate after the prompt
  // Logits are divided by this before the softmax: < 1 sharper, > 1 flatter;
  // 0 = greedy (always the most likely byte).
  double temperature = 0.8;
  int64_t top_k = 0;         // sample among the k most likely bytes (0 = all 256)
  uint64_t seed = 0;         // the sampler's own generator: same seed, same text
};

// The run's config for `checkpoint` (a step directory or a file): the
// config.toml of the run folder that holds it (<run>/checkpoints/<ckpt>), else
// the config saved in the checkpoint's metadata, or `config_path` when given.
// Throws ConfigError when none is found.
TrainConfig config_for_checkpoint(const std::filesystem::path& checkpoint,
                                  const std::filesystem::path& config_path = {});

// Builds the config's model and loads its weights from `checkpoint`
// (sharded or consolidated, any training layout, or an int8 file of
// `paratrain quantize`, dequantized). Eval mode. Throws CheckpointError when
// the checkpoint does not fit the model.
std::shared_ptr<models::Model> load_model_for_inference(const TrainConfig& config,
                                                        const std::filesystem::path& checkpoint);

// Appends `options.tokens` sampled bytes to `prompt` (an empty prompt starts
// from "\n") and returns only the new bytes; each is also passed to
// `on_token` as it is drawn. The context is cropped to the model's last
// `seq_len` tokens. Throws ConfigError on bad options.
std::string generate(models::Model& model, int64_t seq_len, const std::string& prompt,
                     const SamplingOptions& options, const std::function<void(char)>& on_token = {});

}  // namespace paratrain::train

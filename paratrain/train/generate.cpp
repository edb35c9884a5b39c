// Checkpoint -> model, and the sampling loop of generate.h.
#include "paratrain/train/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/inference/trained_model.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain::train {
namespace fs = std::filesystem;

TrainConfig config_for_checkpoint(const fs::path& checkpoint, const fs::path& config_path) {
  if (!config_path.empty()) return load_config(config_path);
  // <run>/checkpoints/step_N (or a file there); also accept a checkpoint
  // copied next to its config.toml.
  const fs::path absolute = fs::absolute(checkpoint).lexically_normal();
  for (const fs::path& dir : {absolute.parent_path().parent_path(), absolute.parent_path()}) {
    if (fs::exists(dir / "config.toml")) return load_config(dir / "config.toml");
  }
  // A checkpoint away from its run (an int8 file, a copied step folder):
  // the config saved in its metadata.
  if (fs::exists(checkpoint)) {
    const auto metadata = checkpoint::ShardedReader(checkpoint).index().metadata;
    if (auto it = metadata.find("config"); it != metadata.end() && it->second != "{}")
      return config_from_json(nlohmann::json::parse(it->second));
  }
  throw ConfigError(fmt::format(
      "found no config.toml for checkpoint {} (looked in the run folder above its checkpoints/ folder and next to "
      "it); pass --config with the run's config.toml",
      checkpoint.string()));
}

std::shared_ptr<models::Model> load_model_for_inference(const TrainConfig& config, const fs::path& checkpoint) {
  if (!builds_gpt(config)) {
    throw ConfigError(fmt::format("generating text needs a model.kind = \"gpt\" run; this config has \"{}\"",
                                  config.model.kind));
  }
  if (fs::is_regular_file(checkpoint) &&
      checkpoint::read_safetensors_metadata(checkpoint).count(kQuantFormatKey) > 0) {
    return load_trained_model(checkpoint).model;  // int8 weights, dequantized (docs/quantization.md)
  }
  auto model = make_model(config);
  checkpoint::CheckpointContents contents;
  contents.model = strategies::replicated_slots(*model, /*write=*/true);
  checkpoint::LoadCheckpointOptions options;
  options.restore_rng = false;  // sampling has its own generator
  checkpoint::load_sharded_checkpoint(checkpoint, contents, options);
  model->eval();
  return model;
}

std::string generate(models::Model& model, int64_t seq_len, const std::string& prompt,
                     const SamplingOptions& o, const std::function<void(char)>& on_token) {
  if (o.tokens < 0) throw ConfigError(fmt::format("--tokens must be >= 0, got {}", o.tokens));
  if (!(o.temperature >= 0)) throw ConfigError(fmt::format("--temperature must be >= 0, got {}", o.temperature));
  if (o.top_k < 0 || o.top_k > 256) throw ConfigError(fmt::format("--top-k must be in [0, 256], got {}", o.top_k));
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> context;
  for (unsigned char c : prompt.empty() ? std::string("\n") : prompt) context.push_back(c);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::string out;
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(context.size()) - seq_len);
    auto window = torch::tensor(std::vector<int64_t>(context.begin() + start, context.end()), torch::kLong);
    at::Tensor logits = model.forward(window.unsqueeze(0)).select(1, -1).squeeze(0).to(torch::kDouble);
    int64_t next = 0;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / o.temperature;
      if (o.top_k > 0) {
        // Everything below the k-th largest logit is never drawn.
        const double kth = std::get<0>(logits.topk(o.top_k)).min().item<double>();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1, /*replacement=*/false, generator).item<int64_t>();
    }
    context.push_back(next);
    out.push_back(static_cast<char>(next));
    if (on_token) on_token(static_cast<char>(next));
  }
  return out;
}

}  // namespace paratrain::train

// make_model: turns the [model] section (plus the dataset's image shape and
// class count) into models::MlpOptions / CnnOptions. Lives with the config
// because only the config knows which dataset feeds the model.
#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/models/cnn.h"
#include "paratrain/models/gpt.h"
#include "paratrain/models/mlp.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/registry.h"

namespace paratrain::train {

bool builds_gpt(const TrainConfig& config) { return config.model.kind == "gpt"; }

std::vector<int64_t> model_input_shape(const TrainConfig& config) {
  // A GPT reads one window of token ids.
  if (builds_gpt(config)) return {config.model.seq_len};
  // Fashion-MNIST is fixed: 1 x 28 x 28 grey images.
  if (config.data.dataset == "synthetic") {
    return {config.data.synthetic_channels, config.data.synthetic_image_size, config.data.synthetic_image_size};
  }
  return {1, 28, 28};
}

std::shared_ptr<models::Model> make_model(const TrainConfig& config) {
  validate_config(config);
  if (const auto* factory = find_model(config.model.kind)) {
    auto model = (*factory)(config);
    if (!model) throw ConfigError(fmt::format("the model factory registered as \"{}\" returned no model", config.model.kind));
    return model;
  }
  if (builds_gpt(config)) {
    return models::make_gpt({.vocab = 256,  // byte tokens (data/text.h)
                             .seq_len = config.model.seq_len,
                             .layers = config.model.layers,
                             .d_model = config.model.d_model,
                             .heads = config.model.heads,
                             .dropout = config.model.dropout,
                             .moe_experts = config.model.moe_experts,
                             .moe_top_k = config.model.moe_top_k,
                             .moe_capacity_factor = config.model.moe_capacity_factor,
                             .moe_every = config.model.moe_every});
  }
  const auto shape = model_input_shape(config);
  const int64_t channels = shape[0];
  const int64_t side = shape[1];
  const int64_t classes = config.data.dataset == "synthetic" ? config.data.synthetic_classes : 10;
  if (config.model.kind == "mlp") {
    return models::make_mlp({.in_features = channels * side * side,
                             .hidden = config.model.hidden,
                             .out_features = classes});
  }
  if (config.model.kind == "cnn") {
    return models::make_cnn({.in_channels = channels,
                             .image_size = side,
                             .num_classes = classes,
                             .channels = config.model.channels,
                             .hidden = config.model.cnn_hidden,
                             .batchnorm = config.model.batchnorm});
  }
  throw ConfigError(fmt::format("model.kind = \"{}\": allowed values are \"mlp\", \"cnn\", \"gpt\"",
                                config.model.kind));
}

}  // namespace paratrain::train

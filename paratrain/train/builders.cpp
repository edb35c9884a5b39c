// Optimizer and dataset factories from the config.
#include "paratrain/train/builders.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/data/fashion_mnist.h"
#include "paratrain/data/synthetic.h"
#include "paratrain/data/text.h"

namespace paratrain::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params) {
  if (c.kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay).nesterov(c.nesterov));
  }
  const auto betas = std::make_tuple(c.betas.at(0), c.betas.at(1));
  if (c.kind == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay));
  }
  if (c.kind == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay));
  }
  throw ConfigError(fmt::format("optimizer.kind = \"{}\": allowed values are \"sgd\", \"adam\", \"adamw\"", c.kind));
}

Datasets load_datasets(const TrainConfig& config) {
  const auto& d = config.data;
  if (d.dataset == "fashion_mnist") {
    return {data::load_fashion_mnist(d.dir, data::Split::kTrain), data::load_fashion_mnist(d.dir, data::Split::kTest)};
  }
  if (d.dataset == "synthetic") {
    data::SyntheticOptions o;
    o.input_shape = {d.synthetic_channels, d.synthetic_image_size, d.synthetic_image_size};
    o.num_classes = d.synthetic_classes;
    o.teacher_seed = static_cast<uint64_t>(config.run.seed) + 1000;
    o.num_samples = d.synthetic_train_size;
    o.seed = static_cast<uint64_t>(config.run.seed) + 1;
    auto train = data::make_synthetic(o);
    o.num_samples = d.synthetic_test_size;
    o.seed = static_cast<uint64_t>(config.run.seed) + 2;
    return {std::move(train), data::make_synthetic(o)};
  }
  if (d.dataset == "text") {
    // The token cache is shared by every run under output_dir (its name
    // hashes the corpus); run names cannot start with '.', so no clash.
    auto text = data::load_text({.source = d.path,
                                 .cache_dir = std::filesystem::path(config.run.output_dir) / ".cache",
                                 .seq_len = config.model.seq_len});
    return {std::move(text.train), std::move(text.validation)};
  }
  throw ConfigError(fmt::format("data.dataset = \"{}\": allowed values are \"fashion_mnist\", \"synthetic\", \"text\"", d.dataset));
}

}  // namespace paratrain::train

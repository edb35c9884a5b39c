// Optimizer, learning-rate schedule and dataset factories from the config.
#include "paratrain/train/builders.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/data/fashion_mnist.h"
#include "paratrain/data/synthetic.h"
#include "paratrain/optim/foreach_adam.h"
#include "paratrain/optim/lamb.h"
#include "paratrain/optim/lars.h"
#include "paratrain/data/text.h"
#include "paratrain/models/model.h"
#include "paratrain/models/recompute.h"
#include "paratrain/train/freeze/freezing.h"
#include "paratrain/train/qat/fake_quant_model.h"
#include "paratrain/train/registry.h"

namespace paratrain::train {

std::function<std::shared_ptr<models::Model>()> seeded_model_factory(const TrainConfig& config, c10::Device device,
                                                                     ModelBuilder builder, FrozenSet* frozen) {
  return [&config, device, builder = std::move(builder), frozen] {
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(static_cast<uint64_t>(config.run.seed));
    auto model = builder ? builder(config) : make_model(config);
    if (!model) throw ConfigError("the program's model builder (TrainerParts::model) returned no model");
    if (!config.freeze.modules.empty()) {
      FrozenSet set = freeze_modules(*model, config.freeze.modules);
      if (frozen) *frozen = std::move(set);
    }
    if (config.train.activation_checkpointing != "none") {
      try {
        model = std::make_shared<models::RecomputedModel>(std::move(model), recompute_policy(config));
      } catch (const ConfigError&) {
        throw;
      } catch (const Error& e) {  // no layers, or a pattern that matches none: the config's to change
        throw ConfigError(fmt::format("train.activation_checkpointing = \"{}\": {}",
                                      config.train.activation_checkpointing, e.what()));
      }
    }
    if (config.quant.qat) {
      auto qat = std::make_shared<FakeQuantModel>(std::move(model), static_cast<int>(config.quant.weight_bits),
                                                  static_cast<int>(config.quant.activation_bits));
      qat->set_active(config.quant.start_step == 0);  // the loop switches it on at quant.start_step
      model = std::move(qat);
    }
    if (!device.is_cpu()) model->to(device);
    return model;
  };
}

parallelize::TpPlan tp_plan_of(const TrainConfig& config) {
  parallelize::TpPlan plan;
  for (const auto& entry : config.parallel.tp_plan) {
    const size_t eq = entry.find('=');  // checked by the config: PATTERN=STYLE
    plan.add(entry.substr(0, eq), entry.substr(eq + 1));
  }
  plan.sequence_parallel = config.parallel.megatron_sp;
  return plan;
}

models::RecomputePolicy recompute_policy(const TrainConfig& config) {
  models::RecomputePolicy policy;
  try {
    policy.mode = models::parse_recompute_mode(config.train.activation_checkpointing);
  } catch (const Error& e) {
    throw ConfigError(fmt::format("train.activation_checkpointing: {}", e.what()));
  }
  policy.every_k = config.train.checkpoint_every_k;
  policy.layers = config.train.checkpoint_layers;
  return policy;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& c,
                                                        const std::vector<at::Tensor>& params,
                                                        const std::vector<int64_t>& full_dims,
                                                        optim::NormReducer norm_reducer) {
  if (c.kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay).nesterov(c.nesterov));
  }
  const auto betas = std::make_tuple(c.betas.at(0), c.betas.at(1));
  if (c.kind == "adam") {
    // Multi-tensor kernels: a few launches per step instead of ~8 per tensor
    // (the host-side cost of a GPU step); bitwise torch::optim::Adam on the CPU.
    return std::make_unique<optim::ForeachAdam>(
        params, torch::optim::AdamOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay));
  }
  if (c.kind == "adamw") {
    return std::make_unique<optim::ForeachAdamW>(
        params, torch::optim::AdamWOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay));
  }
  if (c.kind == "lars" || c.kind == "lamb") {
    // Two param groups (adapted, excluded), both always present, so every
    // rank and every checkpoint has the same group layout.
    optim::ParamSplit split;
    if (c.exclude_from_adaptation) {
      split = optim::split_for_adaptation(params, full_dims);
    } else {
      split.adapted = params;
    }
    if (c.kind == "lars") {
      const auto o = optim::LarsOptions(c.lr)
                         .momentum(c.momentum)
                         .weight_decay(c.weight_decay)
                         .trust_coefficient(c.trust_coefficient)
                         .eps(c.eps);
      auto lars = std::make_unique<optim::Lars>(optim::lars_param_groups(split, o), o);
      lars->set_norm_reducer(std::move(norm_reducer));
      return lars;
    }
    const auto o = optim::LambOptions(c.lr).betas(betas).eps(c.eps).weight_decay(c.weight_decay);
    auto lamb = std::make_unique<optim::Lamb>(optim::lamb_param_groups(split, o), o);
    lamb->set_norm_reducer(std::move(norm_reducer));
    return lamb;
  }
  throw ConfigError(fmt::format(
      "optimizer.kind = \"{}\": allowed values are \"sgd\", \"adam\", \"adamw\", \"lars\", \"lamb\"", c.kind));
}

namespace {

// Epochs as whole optimizer steps: rounded, at least 1 when epochs > 0.
int64_t epochs_to_steps(double epochs, int64_t steps_per_epoch) {
  if (epochs <= 0) return 0;
  return std::max<int64_t>(1, std::llround(epochs * static_cast<double>(steps_per_epoch)));
}

}  // namespace

optim::LrSchedule make_lr_schedule(const TrainConfig& config, const BatchSizes& batch, int64_t steps_per_epoch,
                                   int64_t total_steps) {
  const LrConfig& l = config.lr;
  optim::LrScheduleOptions o;
  o.base_lr = config.optimizer.lr;
  o.base_batch = l.base_batch;
  o.global_batch = batch.global;
  o.scaling = optim::parse_lr_scaling(l.scaling);
  o.warmup_steps = l.warmup_steps > 0 ? l.warmup_steps : epochs_to_steps(l.warmup_epochs, steps_per_epoch);
  o.warmup_start_factor = l.warmup_start_factor;
  o.decay = optim::parse_lr_decay(l.decay);
  o.total_steps = total_steps;
  o.min_lr = l.min_lr;
  o.step_size = l.step_size > 0 ? l.step_size : epochs_to_steps(l.step_epochs, steps_per_epoch);
  o.gamma = l.gamma;
  if (o.decay == optim::LrScheduleOptions::Decay::kCosine && total_steps <= o.warmup_steps) {
    throw ConfigError(fmt::format(
        "lr.decay = \"cosine\" decays after warmup until the run's last step, but the warmup ({} steps{}) is not "
        "shorter than the run ({} steps, from train.epochs / train.max_steps): lower lr.warmup_steps or "
        "lr.warmup_epochs, or train longer",
        o.warmup_steps, l.warmup_epochs > 0 ? fmt::format(" = lr.warmup_epochs {} x {} steps per epoch",
                                                          l.warmup_epochs, steps_per_epoch)
                                            : "",
        total_steps));
  }
  return optim::LrSchedule(o);  // validates the rest (lr.min_lr <= peak, ...)
}

Datasets load_datasets(const TrainConfig& config) {
  const auto& d = config.data;
  if (const auto* factory = find_dataset(d.dataset)) return (*factory)(config);
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

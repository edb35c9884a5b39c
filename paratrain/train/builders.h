// Turns config sections into LibTorch objects: the optimizer, the
// learning-rate schedule and the train/test datasets. The Trainer composes them; tests reuse them to build
// single-process oracles from the same config.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include "paratrain/data/dataset.h"
#include "paratrain/models/recompute.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/optim/layer_norms.h"
#include "paratrain/optim/lr_schedule.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/user_module.h"

namespace torch::optim {
class Optimizer;
}
namespace at {
class Tensor;
}
namespace paratrain::models {
class Model;
}

namespace paratrain::train {

struct FrozenSet;

// optimizer.kind over `params`. LARS and LAMB also use `full_dims` (the
// dim() of the full tensor each param is a piece of, for
// optimizer.exclude_from_adaptation; empty = the params' own) and
// `norm_reducer` (completes per-tensor norms across shards; empty = whole
// tensors): Strategy::layerwise_params() gives both.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<at::Tensor>& params,
                                                        const std::vector<int64_t>& full_dims = {},
                                                        optim::NormReducer norm_reducer = {});

// The [lr] schedule of a run: optimizer.lr is the base rate, scaled for
// `batch.global`; epoch-valued keys are converted with `steps_per_epoch`,
// cosine decay ends at `total_steps` (the run's last optimizer step).
// Throws ConfigError naming the lr.* key (or train.* key) to change.
optim::LrSchedule make_lr_schedule(const TrainConfig& config, const BatchSizes& batch, int64_t steps_per_epoch,
                                   int64_t total_steps);

// The run's initial model, as every call of the result builds it: torch
// seeded with run.seed, the model drawn on the CPU (the same weights
// whatever the device), then moved to `device`. The Trainer's start and
// in-job recovery's rollback to the run's start (in_job_rollback.h) both
// build it here. Draws are serialized process-wide: the generator is
// global, and ranks that are threads of one process (tests) must not reseed
// it in the middle of each other's draw. `config` must outlive the calls.
// `builder`, when given, draws the model instead of make_model(config) (a
// program's own model: TrainerParts::model). freeze.modules are frozen on
// every model drawn (train/freeze/freezing.h); `frozen`, when given, is set
// to what each call froze.
std::function<std::shared_ptr<models::Model>()> seeded_model_factory(const TrainConfig& config, c10::Device device,
                                                                     ModelBuilder builder = {},
                                                                     FrozenSet* frozen = nullptr);

// parallel.tp_plan's "PATTERN=STYLE" entries and parallel.megatron_sp as a
// plan (parallelize/plan.h).
parallelize::TpPlan tp_plan_of(const TrainConfig& config);

// train.activation_checkpointing, checkpoint_every_k and checkpoint_layers
// as the models' recompute policy (models/recompute.h).
models::RecomputePolicy recompute_policy(const TrainConfig& config);

struct Datasets {
  data::TensorDataset train;
  data::TensorDataset test;
};
// Fashion-MNIST from data.dir, or the synthetic task (train and test drawn
// from the same teacher with different seeds).
Datasets load_datasets(const TrainConfig& config);

}  // namespace paratrain::train

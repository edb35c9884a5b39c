// The megatron strategy's pipeline stages: see megatron_stages.h.
#include "paratrain/train/strategies/megatron_stages.h"

#include <torch/torch.h>

#include <set>

#include "paratrain/pipeline/partition.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/train/strategies/pipeline_parts.h"

namespace paratrain::train::strategies {

// The chunks are balanced by parameter count (or pipeline.split): the
// pipeline strategy's time probe would run tp and cp collectives on one
// rank only. The boundary shapes are per example of this cp rank's chunk,
// [S/cp, d] (under Megatron-SP [S/(cp tp), d]): shape inference runs the
// layers on [1, S/cp] token ids, collectively over tp and cp like a step.
MegatronStages::MegatronStages(const TrainConfig& config, models::ParallelGpt& model, topology::DeviceMesh& mesh,
                               const pipeline::ScheduleOptions& shape, std::chrono::milliseconds timeout) {
  const auto layers = model.layers();
  const int chunks = shape.stages * shape.virtual_stages;
  const auto shapes = pipeline::infer_boundary_shapes(layers, {config.model.seq_len / model.cp_size()}, at::kLong);
  bounds_ = config.pipeline.split.empty()
                ? pipeline::balanced_partition(pipeline::layer_parameter_counts(layers), chunks)
                : pipeline::explicit_partition(config.pipeline.split, static_cast<int>(layers.size()), chunks);
  std::set<std::string> listed;
  for (int mc = 0; mc < chunks; ++mc) {
    for (int j = bounds_[mc]; j < bounds_[mc + 1]; ++j) {
      for (const auto& [prefix, module] : layers[j].modules) {
        for (const auto& p : module->named_parameters()) {
          const std::string name = prefix + "." + p.key();
          if (listed.insert(name).second) stage_of_.emplace_back(name, mc % shape.stages);
        }
      }
    }
  }
  comm::ProcessGroup& pp = mesh.group(topology::Axis::kPp);
  auto local = local_chunks(layers, shapes, bounds_, shape, pp.rank(), model.options().recompute);
  std::vector<std::shared_ptr<pipeline::StageModule>> modules;
  for (const auto& c : local) {
    modules.push_back(c.module);
    chunks_.push_back(c.module);
  }
  module_ = pipeline::merge_chunks(modules);
  tied_ = std::make_unique<pipeline::TiedGradients>(
      mesh, pipeline::find_tied_parameters(layers, bounds_, shape.stages), *module_, timeout);
  tied_->broadcast_from_first();
  pipeline::ExecutorOptions options = executor_options(config, shape, timeout);
  // Frozen chunks before every trainable one run no backward (Note
  // [Freezing in the megatron strategy]).
  options.frozen_chunks = frozen_prefix_chunks(layers, bounds_);
  executor_ = std::make_unique<pipeline::Executor>(pp, std::move(local), options);
}

MegatronStages::~MegatronStages() = default;

pipeline::StepReport MegatronStages::train_step(const at::Tensor& inputs, const at::Tensor& targets,
                                                const pipeline::MicrobatchLoss& loss,
                                                const pipeline::ExecutorHooks& hooks) {
  return executor_->train_step(inputs, targets, loss, hooks, nullptr, steps_++);
}

}  // namespace paratrain::train::strategies

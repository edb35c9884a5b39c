// Pieces of the strategies that run pipeline stages: see pipeline_parts.h.
#include "paratrain/train/strategies/pipeline_parts.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/strategies/common.h"
#include "paratrain/train/task.h"

namespace paratrain::train::strategies {

pipeline::ScheduleOptions pipeline_shape(const TrainConfig& config, int stages, int dp) {
  pipeline::ScheduleOptions shape;
  shape.stages = stages;
  shape.microbatches = static_cast<int>(config.pipeline.microbatches);
  shape.virtual_stages = static_cast<int>(config.pipeline.virtual_stages);
  pipeline::validate_schedule(pipeline::parse_schedule(config.pipeline.schedule), shape);
  const int64_t per_rank = resolve_batch_sizes(config, dp).per_rank;
  if (per_rank % config.pipeline.microbatches != 0) {
    throw ConfigError(fmt::format(
        "pipeline.microbatches = {} does not divide the batch of each pipeline replica ({} = data.batch_size, or "
        "data.global_batch_size / (dp * train.accumulate)): pick a divisor of {} or change the batch size",
        config.pipeline.microbatches, per_rank, per_rank));
  }
  return shape;
}

std::vector<pipeline::LocalChunk> local_chunks(const std::vector<models::Layer>& layers,
                                               const pipeline::BoundaryShapes& shapes, const std::vector<int>& bounds,
                                               const pipeline::ScheduleOptions& shape, int stage,
                                               const models::RecomputePolicy& recompute) {
  std::vector<std::string> names;
  for (const auto& layer : layers) names.push_back(layer.name);
  const std::vector<int> segment_of = models::recompute_segments(names, recompute);
  std::vector<pipeline::LocalChunk> out;
  for (int i = 0; i < shape.virtual_stages; ++i) {
    const int mc = i * shape.stages + stage;
    pipeline::LocalChunk c;
    c.module = std::make_shared<pipeline::StageModule>(
        std::vector<models::Layer>(layers.begin() + bounds[mc], layers.begin() + bounds[mc + 1]),
        std::vector<int>(segment_of.begin() + bounds[mc], segment_of.begin() + bounds[mc + 1]), recompute.generators);
    c.model_chunk = mc;
    c.input_shape = shapes.shapes[bounds[mc]];
    c.input_dtype = shapes.dtypes[bounds[mc]];
    c.output_shape = shapes.shapes[bounds[mc + 1]];
    c.output_dtype = shapes.dtypes[bounds[mc + 1]];
    out.push_back(std::move(c));
  }
  return out;
}

pipeline::ExecutorOptions executor_options(const TrainConfig& config, const pipeline::ScheduleOptions& shape,
                                           std::chrono::milliseconds timeout) {
  pipeline::ExecutorOptions options;
  options.schedule = pipeline::parse_schedule(config.pipeline.schedule);
  options.shape = shape;
  options.checkpoint_activations = config.pipeline.checkpoint_activations;
  options.autocast = compute_dtype(config);
  options.timeout = timeout;
  return options;
}

void refuse_tensors_shared_by_chunks(const TrainConfig& config, const std::vector<models::Layer>& layers,
                                     const std::vector<int>& bounds, int stages, int dp) {
  const bool wrapped = config.zero.stage > 0 || (dp > 1 && config.ddp.mode != "none");
  const int chunks = static_cast<int>(bounds.size()) - 1;
  if (!wrapped || chunks <= stages) return;  // one chunk per rank
  std::map<std::pair<int, const c10::TensorImpl*>, int> owner;  // (stage, tensor) -> chunk
  for (int mc = 0; mc < chunks; ++mc) {
    for (int j = bounds[mc]; j < bounds[mc + 1]; ++j) {
      for (const auto& [prefix, module] : layers[j].modules) {
        for (const auto& p : module->named_parameters()) {
          const auto [it, added] = owner.emplace(std::make_pair(mc % stages, p.value().unsafeGetTensorImpl()), mc);
          if (added || it->second == mc) continue;
          throw ConfigError(fmt::format(
              "parameter {}.{} is shared by two model chunks on pipeline rank {} (a tied weight with "
              "pipeline.virtual_stages = {}), which {} would reduce and step twice: cut the model so the "
              "pair lands on different ranks or in one chunk (pipeline.split), or use {}",
              prefix, p.key(), mc % stages, chunks / stages,
              config.zero.stage > 0 ? "ZeRO's per-chunk shards" : "DDP's per-chunk reducers",
              config.zero.stage > 0 ? "zero.stage = 0" : "one data-parallel replica"));
        }
      }
    }
  }
}

pipeline::ExecutorHooks ddp_chunk_hooks(const std::vector<std::unique_ptr<ddp::DistributedDataParallel>>& ddp,
                                        bool sync) {
  pipeline::ExecutorHooks hooks;
  if (ddp.empty()) return hooks;
  hooks.before_forward = [&ddp](int chunk) { ddp[chunk]->prepare_forward(); };
  hooks.before_backward = [&ddp, sync](int chunk, bool last) { ddp[chunk]->reducer().set_sync_enabled(sync && last); };
  hooks.after_backward = [&ddp, sync](int chunk, bool last) {
    if (sync && last) ddp[chunk]->finish_backward();
  };
  return hooks;
}

at::Tensor from_last_stage(const at::Tensor& t, const std::vector<int64_t>& shape, comm::ProcessGroup& pp,
                           std::chrono::milliseconds timeout, c10::Device device) {
  // Every rank's tensor on the stages' device: a broadcast's members must
  // agree on where its tensor lives (NCCL carries GPU tensors only).
  at::Tensor out = t.defined() ? t.to(at::kFloat).to(device).reshape(shape).contiguous().clone()
                               : torch::empty(shape, torch::TensorOptions().device(device));
  pp.broadcast(out, pp.size() - 1)->wait(timeout);
  return out;
}

// Note [Stages by rank speed]
// pipeline.balance = "rank_speed": the layer costs are the measured times
// (as "time": the per-layer minimum over ranks, the cost's shape), and
// chunk j's cost is scaled by how slow its stage's ranks are: each rank's
// own time for the whole model's layers (profile.test_slow_factor counts,
// as it does in training), the slowest replica of each stage (a max over
// dp: a step waits for it), over the fastest stage. The min-max partition
// then gives a stage twice as slow about half the work.
std::vector<double> rank_speed_scales(double own_seconds, int chunks, comm::ProcessGroup& dp, comm::ProcessGroup& pp,
                                      std::chrono::milliseconds timeout, bool log) {
  at::Tensor t = torch::tensor({own_seconds}, torch::kDouble);
  dp.all_reduce(t, comm::ReduceOp::kMax)->wait(timeout);
  at::Tensor stages = torch::empty({pp.size()}, torch::kDouble);
  pp.all_gather(stages, t)->wait(timeout);
  const std::vector<double> per_stage(stages.data_ptr<double>(), stages.data_ptr<double>() + pp.size());
  const double fastest = *std::min_element(per_stage.begin(), per_stage.end());
  if (!(fastest > 0) || !std::isfinite(*std::max_element(per_stage.begin(), per_stage.end()))) return {};
  std::vector<double> scales;
  for (int j = 0; j < chunks; ++j) scales.push_back(per_stage[static_cast<size_t>(j % pp.size())] / fastest);
  if (log) {
    std::vector<std::string> shown;
    for (double s : per_stage) shown.push_back(fmt::format("{:.3g}", 1e3 * s));
    spdlog::info("pipeline.balance = rank_speed: the model's layers take [{}] ms on the stages' slowest ranks; "
                 "each stage's chunks are weighted by it",
                 fmt::join(shown, ", "));
  }
  return scales;
}

std::vector<double> measured_layer_costs(const TrainConfig& config, const std::vector<models::Layer>& layers,
                                         const pipeline::BoundaryShapes& shapes, int dp, comm::ProcessGroup& world,
                                         std::chrono::milliseconds timeout, double* own_seconds) {
  const int64_t rows = resolve_batch_sizes(config, dp).per_rank / config.pipeline.microbatches;
  // The last layer's time includes the objective's loss (cross-entropy over
  // the last dimension; which targets does not change its cost).
  const auto task = task_for_config(config);
  const auto mine = pipeline::measure_layer_times(layers, shapes, rows, [&task](const at::Tensor& out) {
    const auto lead = out.sizes().slice(0, out.dim() - 1);
    return task->loss(out, torch::zeros(lead, torch::TensorOptions().dtype(torch::kLong).device(out.device())));
  });
  *own_seconds = 0;
  for (double t : mine) *own_seconds += t;
  at::Tensor t = torch::tensor(mine, torch::kDouble);
  world.all_reduce(t, comm::ReduceOp::kMin)->wait(timeout);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

int frozen_prefix_chunks(const std::vector<models::Layer>& layers, const std::vector<int>& bounds) {
  const int chunks = static_cast<int>(bounds.size()) - 1;
  for (int mc = 0; mc < chunks; ++mc) {
    for (int j = bounds[mc]; j < bounds[mc + 1]; ++j)
      for (const auto& [name, module] : layers[j].modules)
        for (const auto& p : module->parameters())
          if (p.requires_grad()) return mc;
  }
  return chunks;
}

std::vector<StageParam> stage_layout(const std::vector<models::Layer>& layers, const std::vector<int>& bounds,
                                     int stages) {
  std::vector<StageParam> out;
  std::set<std::string> listed;
  const int chunks = static_cast<int>(bounds.size()) - 1;
  for (int mc = 0; mc < chunks; ++mc) {
    for (int j = bounds[mc]; j < bounds[mc + 1]; ++j) {
      for (const auto& [prefix, module] : layers[j].modules) {
        for (const auto& p : module->named_parameters()) {
          if (!listed.insert(prefix + "." + p.key()).second) continue;
          out.push_back({prefix + "." + p.key(), p.value().sizes().vec(), mc % stages});
        }
      }
    }
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> broadcast_stage_parameters(
    const std::vector<StageParam>& layout, const std::map<std::string, at::Tensor>& held, comm::ProcessGroup& pp,
    std::chrono::milliseconds timeout) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& info : layout) {
    // On the host on every rank: the broadcast's members must agree on the
    // device, and checkpoints are written from host memory anyway.
    at::Tensor t = info.owner == pp.rank() ? held.at(info.name).detach().to(at::kCPU).clone().contiguous()
                                           : torch::empty(info.shape);
    pp.broadcast(t, info.owner)->wait(timeout);
    out.emplace_back(info.name, t);
  }
  return out;
}

}  // namespace paratrain::train::strategies

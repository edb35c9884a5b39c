// What the strategies that run pipeline stages share (the pipeline strategy,
// and the megatron strategy with parallel.pp > 1): the schedule's shape from
// the config, this rank's chunks from a partition, the executor's options,
// DDP on each chunk through the executor's hooks, values the last stage
// holds handed to every stage, and the stage weights of pipeline.balance =
// "rank_speed".
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/models/model.h"
#include "paratrain/models/recompute.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/schedule.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train::strategies {

// pipeline.{schedule, microbatches, virtual_stages} on `stages` stages,
// validated; ConfigError when pipeline.microbatches does not divide the
// batch each of the `dp` pipeline replicas computes.
pipeline::ScheduleOptions pipeline_shape(const TrainConfig& config, int stages, int dp);

// pipeline.balance = "rank_speed" (Note [Stages by rank speed] in
// pipeline_parts.cpp): each of `chunks` chunks' cost scale, from this rank's
// own time for the whole model's layers (`own_seconds`, a test slowdown
// included). Collective over dp and pp; the same on every rank; empty when
// a time is not positive and finite. `log`: this rank logs the stage times.
std::vector<double> rank_speed_scales(double own_seconds, int chunks, comm::ProcessGroup& dp, comm::ProcessGroup& pp,
                                      std::chrono::milliseconds timeout, bool log);

// This rank's chunks: model chunk i * stages + stage for each virtual stage
// i, holding layers [bounds[mc], bounds[mc + 1]), with the activation
// checkpointing segments `recompute` gives the whole model's layers (a
// segment across a chunk boundary is cut there).
std::vector<pipeline::LocalChunk> local_chunks(const std::vector<models::Layer>& layers,
                                               const pipeline::BoundaryShapes& shapes, const std::vector<int>& bounds,
                                               const pipeline::ScheduleOptions& shape, int stage,
                                               const models::RecomputePolicy& recompute = {});

// pipeline.* and precision.compute as executor options.
pipeline::ExecutorOptions executor_options(const TrainConfig& config, const pipeline::ScheduleOptions& shape,
                                           std::chrono::milliseconds timeout);

// ConfigError when one tensor sits in two chunks of one rank (a tied pair
// both on one rank, interleaved: chunk j of `bounds` runs on stage
// j % stages) while each chunk gets its own DDP (dp > 1) or ZeRO wrapper:
// both would reduce and step it. The same verdict on every rank.
void refuse_tensors_shared_by_chunks(const TrainConfig& config, const std::vector<models::Layer>& layers,
                                     const std::vector<int>& bounds, int stages, int dp);

// DDP on each local chunk (one wrapper per chunk, in local order): prepare
// before a forward, reduce only in the chunk's last backward of the step
// (earlier micro-batches accumulate locally) and only when `sync`.
pipeline::ExecutorHooks ddp_chunk_hooks(const std::vector<std::unique_ptr<ddp::DistributedDataParallel>>& ddp,
                                        bool sync);

// pipeline.balance = "time" and "rank_speed": each layer's forward and
// backward time on `rows` = one micro-batch of a replica (the last layer's
// with the task's loss). Every rank times the layers (it holds the whole
// model until the cut) and all take the per-layer minimum over `world`:
// one cut everywhere, and a probe that another process disturbed on one
// rank is corrected by the others. `own_seconds`: this rank's own sum.
std::vector<double> measured_layer_costs(const TrainConfig& config, const std::vector<models::Layer>& layers,
                                         const pipeline::BoundaryShapes& shapes, int dp, comm::ProcessGroup& world,
                                         std::chrono::milliseconds timeout, double* own_seconds);

// The leading model chunks of `bounds` that train nothing and feed nothing
// that trains (Note [What freezing saves] in train/freeze/freezing.cpp):
// the same count on every rank, from the whole model each rank drew.
int frozen_prefix_chunks(const std::vector<models::Layer>& layers, const std::vector<int>& bounds);

// A parameter of the whole model and the stage (pp rank) that holds it.
struct StageParam {
  std::string name;
  std::vector<int64_t> shape;
  int owner = 0;
};
// Each parameter once, in model order, owned by the first stage holding it
// (model chunk mc of `bounds` runs on stage mc % stages).
std::vector<StageParam> stage_layout(const std::vector<models::Layer>& layers, const std::vector<int>& bounds,
                                     int stages);
// The whole model's parameters on every stage, on the host: each broadcast
// over `pp` from its owner's `held` (by name). Collective over pp.
std::vector<std::pair<std::string, at::Tensor>> broadcast_stage_parameters(
    const std::vector<StageParam>& layout, const std::map<std::string, at::Tensor>& held, comm::ProcessGroup& pp,
    std::chrono::milliseconds timeout);

// A value only the last stage holds (`t`, undefined elsewhere: the loss, the
// evaluation logits) on every stage: broadcast over `pp` into a tensor of
// `shape` (float32) on `device` (the stage's). Collective over pp.
at::Tensor from_last_stage(const at::Tensor& t, const std::vector<int64_t>& shape, comm::ProcessGroup& pp,
                           std::chrono::milliseconds timeout, c10::Device device);

}  // namespace paratrain::train::strategies

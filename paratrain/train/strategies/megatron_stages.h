// The megatron strategy's pipeline axis (parallel.pp > 1): the tensor- and
// context-parallel GPT's layers (ParallelGpt::layers()) cut into chunks, this
// rank's kept and run by pipeline/'s executor and schedules, the tied wte's
// copies summed over the first and last stage. Every tp and cp peer of a
// stage runs the same schedule, so the collectives inside its layers pair
// up; a boundary carries this rank's part of the activations to the rank of
// the next stage with the same (dp, tp, cp) coordinates (its pp group).
// Not here: the replicas' reduction (replica_sync.h), the loss and the
// optimizer step (megatron_strategy.cpp). docs/notes/megatron.md.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/models/parallel_gpt.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/schedule.h"
#include "paratrain/pipeline/tied.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train::strategies {

class MegatronStages {
 public:
  // Collective over the world (the tied embedding's stage groups) and over
  // tp and cp (the boundary shapes come from one forward of the layers).
  // `model` may be dropped afterwards: the chunks hold its layers.
  MegatronStages(const TrainConfig& config, models::ParallelGpt& model, topology::DeviceMesh& mesh,
                 const pipeline::ScheduleOptions& shape, std::chrono::milliseconds timeout);
  ~MegatronStages();

  // This rank's chunks in local order, and all of them as one module whose
  // parameter names are the single-process GPT's.
  const std::vector<std::shared_ptr<torch::nn::Module>>& chunks() const { return chunks_; }
  std::shared_ptr<torch::nn::Module> module() const { return module_; }
  const std::vector<int>& bounds() const { return bounds_; }
  // Each parameter's first stage, in the single-process order.
  const std::vector<std::pair<std::string, int>>& stage_of() const { return stage_of_; }

  // One step's schedule over this cp rank's chunk of the batch.
  pipeline::StepReport train_step(const at::Tensor& inputs, const at::Tensor& targets,
                                  const pipeline::MicrobatchLoss& loss, const pipeline::ExecutorHooks& hooks);
  // The copies' gradients summed over their stages (call on every rank after
  // the step's last backward).
  void sum_tied_gradients() { tied_->all_reduce_gradients(); }
  bool is_copy(const std::string& name) const { return tied_->is_copy(name); }
  // The whole batch chunk as one micro-batch: this rank's logit columns on
  // the last stage, undefined elsewhere.
  at::Tensor forward_only(const at::Tensor& inputs) { return executor_->forward_only(inputs); }

 private:
  std::vector<int> bounds_;
  std::vector<std::pair<std::string, int>> stage_of_;
  std::vector<std::shared_ptr<torch::nn::Module>> chunks_;
  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<pipeline::TiedGradients> tied_;
  std::unique_ptr<pipeline::Executor> executor_;
  int64_t steps_ = 0;
};

}  // namespace paratrain::train::strategies

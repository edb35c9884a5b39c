// A planned model in the megatron strategy: see megatron_planned.h.
#include "paratrain/train/strategies/megatron_planned.h"

#include <torch/torch.h>

#include <algorithm>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/models/recompute.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/parallelize/sites.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/strategies/megatron_freeze.h"

namespace paratrain::train::strategies {

PlannedModel plan_model(const TrainConfig& config, const std::shared_ptr<models::Model>& full,
                        const std::set<std::string>& frozen, const tensor_parallel::TpContext& tp) {
  const parallelize::TpPlan plan = tp_plan_of(config);
  // Activation checkpointing's wrapper is made again around the planned
  // model, so its recompute replays this rank's in-region stream too.
  std::shared_ptr<models::Model> inner = full;
  auto* recomputed = dynamic_cast<models::RecomputedModel*>(full.get());
  if (recomputed != nullptr) inner = recomputed->inner();
  PlannedModel out;
  try {
    auto applied = parallelize::parallelize_module(
        *inner, plan, {.tp = tp, .cp = nullptr, .seed = static_cast<uint64_t>(config.run.seed)});
    out.layout = std::move(applied.layout);
    out.sequence_parallel_params = std::move(applied.sequence_parallel_params);
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {  // a rule or module the config names
    throw ConfigError(fmt::format("parallel.tp_plan: {}", e.what()));
  }
  keep_frozen(*inner, frozen);
  out.sequence_parallel_params = trainable(std::move(out.sequence_parallel_params));
  out.model = inner;
  if (recomputed != nullptr) {
    models::RecomputePolicy policy = recompute_policy(config);
    policy.generators.push_back(*parallelize::region_generator(*inner));
    out.model = std::make_shared<models::RecomputedModel>(inner, policy);
  }
  return out;
}

// Note [A planned model's output]
// The Trainer's loss and evaluation take the model's output as the whole
// output on every tp rank. After the first forward (training or
// evaluation) two things would break that silently and are checked: a
// planned layer run as layer(x) instead of at its site (check_sites_ran),
// and a plan that leaves the output split (its last split layer colwise
// without [gather], or the sequence still split under Megatron-SP): the
// tp ranks then hold different outputs, which one broadcast shows.
void check_planned_output(torch::nn::Module& model, const at::Tensor& out, comm::ProcessGroup& tp,
                          std::chrono::milliseconds timeout) {
  parallelize::check_sites_ran(model);
  if (tp.size() == 1) return;
  const at::Tensor mine = out.detach().to(at::kFloat).contiguous();
  at::Tensor first = mine.clone();
  tp.broadcast(first, 0)->wait(timeout);
  const double scale = std::max(first.numel() > 0 ? first.abs().max().item<double>() : 0.0, 1e-12);
  at::Tensor worst = torch::full({1}, first.numel() > 0 ? (mine - first).abs().max().item<double>() / scale : 0.0,
                                 torch::TensorOptions().dtype(torch::kDouble).device(mine.device()));
  tp.all_reduce(worst, comm::ReduceOp::kMax)->wait(timeout);
  const double diff = worst.item<double>();
  if (diff > 1e-5) {
    throw ConfigError(fmt::format(
        "parallel.tp_plan: the model's output differs between the tensor-parallel ranks (relative {:.3g}): the "
        "plan leaves it split. The last split layer must give the whole output (colwise[gather], or rowwise), "
        "and under parallel.megatron_sp a head that needs every position must come after "
        "parallelize::leave_sequence_parallel (docs/tensor-parallel-plans.md)",
        diff));
  }
}

}  // namespace paratrain::train::strategies

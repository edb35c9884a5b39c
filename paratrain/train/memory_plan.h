// The memory planner behind `paratrain plan`: per-rank bytes of parameters,
// gradients and optimizer state for ZeRO stages 0-3 (arXiv 1910.02054,
// section 3) from the configured model's parameter count (for the GPT under
// parallel.tp / pp: what its fullest rank holds), plus what activation_plan.h
// counts beyond that state (communication buffers, activations, the
// loader, backward's largest new gradient). Pure arithmetic: builds no model
// and measures nothing (`paratrain plan --measure` does); the allocator's
// overhead and memory that is not tensors come on top.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/train/activation_plan.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train {

struct PlanOptions {
  // Ranks in the job; the data-parallel group that shards the model state
  // is world / (parallel.tp * pp * cp). 0 = what the config implies:
  // parallel.dp * tp * pp * cp when parallel.dp is set, else tp * pp * cp.
  int64_t world = 0;
  // Per-rank memory budget in GiB (2^30 bytes); 0 = no budget (no fit column).
  double memory_gib = 0;
};

// Bytes per rank of one ZeRO stage; `*_bytes` are fp32 training (what this
// CPU build runs), `mixed_*` the paper's mixed-precision Adam for reference.
struct StageMemory {
  int stage = 0;
  int64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0, total_bytes = 0;
  int64_t mixed_params_bytes = 0, mixed_grads_bytes = 0, mixed_optimizer_bytes = 0, mixed_total_bytes = 0;
  /// Communication buffers of the stage's strategy (Note [Communication
  /// buffers]): ZeRO-1/2's flat gradient buckets, FSDP's gathered unit and
  /// its full gradient. Planned from a config only; 0 from a bare count.
  int64_t buffer_bytes = 0;
  bool fits = true;  // total_bytes + buffers + bytes_beyond_state <= budget (true without a budget)
};

struct MemoryPlan {
  std::string model;          // "mlp 784-256-128-10", "cnn ..."
  int64_t parameters = 0;     // Ψ: of the fullest rank when tp / pp are planned (the GPT)
  int64_t tp = 1;             // parallel.tp
  int64_t pp = 1;             // parallel.pp
  int64_t whole_parameters = 0;  // the whole model's count when Ψ is a tp / pp share; else 0
  int64_t dp = 1;             // N, the ranks sharding the state
  int64_t shard_elements = 0; // ceil(Ψ / N): shards round up, the flat buffer is padded to N * this
  std::string optimizer;      // optimizer.kind (+ momentum for SGD)
  int64_t state_bytes_per_param = 0;  // K: 8 Adam/AdamW, 4 SGD with momentum, 0 plain SGD
  int64_t budget_bytes = 0;           // 0 = none
  std::vector<StageMemory> stages;    // stages 0, 1, 2, 3
  int lowest_fitting_stage = -1;      // -1: no budget, or nothing fits
  // When nothing fits: the fewest dp ranks with which stage 3 fits (-1: none can,
  // the budget is below one element's state).
  int64_t dp_needed_for_stage3 = -1;
  ActivationPlan activations;         // of the fullest rank (unmodelled for the count-only overload)
  std::vector<std::string> notes;     // what the numbers leave out
};

// Ψ of make_model(config), computed from the config alone so that a plan for
// a model too big for this machine allocates nothing (tests check it against
// the built model). Throws ConfigError if the count overflows int64.
int64_t parameter_count(const TrainConfig& config);

// The experts' parameters of a mixture-of-experts GPT (model.moe_experts;
// 0 for any other model): parallel.ep splits them over an ep group.
int64_t gpt_expert_parameters(const TrainConfig& config);

// Ψ of the fullest rank of the built-in GPT under parallel.tp and
// parallel.pp: its pipeline stage's layers (cut as the megatron strategy
// cuts them), each a tensor-parallel shard (Megatron's layout). Without
// either, or for another model: parameter_count(config).
int64_t parameters_per_rank(const TrainConfig& config);

// The plan for `config` on `options.world` ranks. Throws ConfigError on a
// world that parallel.tp * pp * cp does not divide, or a budget <= 0 / not finite.
MemoryPlan plan_memory(const TrainConfig& config, const PlanOptions& options);

// The same from a parameter count and the optimizer state per parameter (K);
// `extra_bytes[stage]` per rank (activations, buffers) count against the
// budget too.
MemoryPlan plan_memory(int64_t parameters, int64_t dp, int64_t state_bytes_per_param, double memory_gib,
                       std::array<int64_t, 4> extra_bytes = {});

// What a rank needs at `stage` besides the model state: the communication
// buffers, the activations, the loader's bytes and backward's largest new
// gradient (activation_plan.h); the buffers only when the activations are
// not modelled.
int64_t bytes_beyond_state(const MemoryPlan& plan, int stage);

// A readable table (stage, params, grads, optimizer, total per rank, fits),
// the formulas, and the verdict on the budget.
std::string format_plan(const MemoryPlan& plan);
nlohmann::json plan_to_json(const MemoryPlan& plan);

}  // namespace paratrain::train

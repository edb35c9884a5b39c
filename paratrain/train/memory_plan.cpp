// The ZeRO memory planner (see memory_plan.h): per-stage bytes from the
// formulas for Ψ (parameter_count.cpp), a table and JSON.
#include "paratrain/train/memory_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/checked_count.h"

namespace paratrain::train {
namespace {

using detail::checked_add;
using detail::checked_mul;
StageMemory stage_memory(int stage, int64_t psi, int64_t dp, int64_t k);
std::string human(int64_t bytes);
std::string with_commas(int64_t n);
std::string model_name(const TrainConfig& c);

// Note [ZeRO memory formulas]
// Per rank, with Ψ parameters sharded over N data-parallel ranks and K bytes
// of optimizer state per parameter (ZeRO paper, section 3):
//   stage 0 (DDP):  params + grads + state all full;
//   stage 1:        state / N;
//   stage 2:        + grads / N;
//   stage 3 (FSDP): + params / N.
// This CPU build trains in fp32: params 4Ψ, grads 4Ψ, state KΨ with K = 8
// for Adam/AdamW (exp_avg, exp_avg_sq), 4 for SGD with momentum (the
// momentum buffer), 0 for plain SGD. The paper's mixed-precision Adam keeps
// fp16 params 2Ψ and grads 2Ψ plus fp32 master weights, momentum and
// variance 12Ψ: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N; it is printed beside
// ours for reference. A sharded part holds ceil(Ψ/N) elements on every rank
// (the flat buffer is padded to a multiple of N), so /N rounds up.
constexpr int64_t kFp32 = 4;
constexpr int64_t kMixedParam = 2, kMixedGrad = 2, kMixedAdamState = 12;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

MemoryPlan plan_memory(const TrainConfig& config, const PlanOptions& options) {
  validate_config(config);
  const int64_t split = checked_mul(checked_mul(config.parallel.tp, config.parallel.pp), config.parallel.cp);
  // world 0: the one the config implies (parallel.dp set), else one rank.
  const int64_t world = options.world != 0 ? options.world
                        : config.parallel.dp > 0 ? checked_mul(config.parallel.dp, split)
                                                 : split;
  if (world < 1 || world % split != 0)
    throw ConfigError(fmt::format(
        "paratrain plan: --world {} must be a positive multiple of parallel.tp * pp * cp = {}", world, split));
  const int64_t dp = world / split;
  if (config.parallel.dp > 0 && config.parallel.dp != dp)
    throw ConfigError(fmt::format("paratrain plan: parallel.dp = {} but --world {} / (tp * pp * cp = {}) = {}: "
                                  "pass --world {} or leave parallel.dp = 0",
                                  config.parallel.dp, world, split, dp, checked_mul(config.parallel.dp, split)));
  const auto& o = config.optimizer;
  // Bytes of optimizer state per parameter: SGD's momentum buffer (LARS
  // always keeps its velocity), Adam's, AdamW's and LAMB's two moments.
  const int64_t k = o.kind == "lars" ? 4 : o.kind == "sgd" ? (o.momentum > 0 ? 4 : 0) : 8;
  // Under tensor and pipeline parallelism a rank holds its tp shard of its
  // stage's layers, which ZeRO then shards over dp (Ψ below).
  const bool gpt = builds_gpt(config);
  const bool tp_planned = !gpt && config.parallel.tp > 1 && !config.parallel.tp_plan.empty();
  const bool split_planned = (gpt && (config.parallel.tp > 1 || config.parallel.pp > 1)) || tp_planned;
  const ActivationPlan activations = plan_activations(config, dp);
  const int64_t psi = parameters_per_rank(config);
  const auto buffers = communication_buffer_bytes(config, psi, dp);
  std::array<int64_t, 4> extra{};
  for (int stage = 0; stage <= 3; ++stage) {
    extra[stage] = checked_add(checked_add(buffers[stage], activations.total_bytes),
                               checked_add(activations.data_bytes, activations.transient_bytes));
  }
  // Under cp (the megatron strategy) ZeRO shards over the replicas, the dp x
  // cp ranks holding the same parameters (train/strategies/replica_sync.h).
  const int64_t shards = checked_mul(dp, config.parallel.cp);
  MemoryPlan plan = plan_memory(psi, shards, k, options.memory_gib, extra);
  for (int stage = 0; stage <= 3; ++stage) plan.stages[stage].buffer_bytes = buffers[stage];
  plan.activations = activations;
  for (const auto& note : activations.notes) plan.notes.push_back(note);
  plan.model = model_name(config);
  plan.optimizer = o.kind == "sgd" ? fmt::format("sgd (momentum {})", o.momentum) : o.kind;
  plan.tp = config.parallel.tp;
  plan.pp = config.parallel.pp;
  if (tp_planned) {
    plan.whole_parameters = parameter_count(config);
    plan.notes.push_back(fmt::format(
        "parallel.tp = {}: Ψ is what one tensor-parallel rank holds of the {} parameters under parallel.tp_plan "
        "(split layers 1/tp each, the rest whole); activations are counted as on one rank (an upper bound)",
        config.parallel.tp, with_commas(plan.whole_parameters)));
  } else if (split_planned) {
    plan.whole_parameters = parameter_count(config);
    plan.notes.push_back(fmt::format(
        "parallel.tp = {}, pp = {}: Ψ is what the fullest rank holds of the {} parameters: its stage's layers "
        "(balanced by parameters, as the megatron strategy cuts them and the pipeline strategy does with "
        "pipeline.balance = \"parameters\"; the last stage keeps the tied wte too), "
        "each one tensor-parallel shard (wte's rows, qkv, mlp.fc and the row-parallel weights split; wpe, "
        "LayerNorms and row biases whole)",
        config.parallel.tp, config.parallel.pp, with_commas(plan.whole_parameters)));
  }
  if (gpt && config.parallel.ep > 1) {
    plan.whole_parameters = parameter_count(config);
    plan.notes.push_back(fmt::format(
        "parallel.ep = {}: Ψ is a rank's dense parameters and its {} of the {} experts of each MoE layer ({} of "
        "the model's {} expert parameters); ZeRO-1/2 shard only the dense part, so their rows count the experts' "
        "state as sharded where each rank holds its experts' whole",
        config.parallel.ep, config.model.moe_experts / config.parallel.ep, config.model.moe_experts,
        with_commas(gpt_expert_parameters(config) / config.parallel.ep), with_commas(gpt_expert_parameters(config))));
  }
  if (config.parallel.cp > 1)
    plan.notes.push_back(fmt::format(
        "parallel.cp = {}: parameters are not split by cp; ZeRO shards them over the dp x cp = {} ranks holding the "
        "same ones (N)",
        config.parallel.cp, shards));
  const int64_t unplanned = split_planned ? 1 : checked_mul(config.parallel.tp, config.parallel.pp);
  if (unplanned > 1)
    plan.notes.push_back(fmt::format("parallel.tp * pp = {}: not planned here (Ψ counts as if on one rank of each axis)",
                                     unplanned));
  return plan;
}

MemoryPlan plan_memory(int64_t parameters, int64_t dp, int64_t state_bytes_per_param, double memory_gib,
                       std::array<int64_t, 4> extra_bytes) {
  if (parameters < 0 || dp < 1 || state_bytes_per_param < 0)
    throw ConfigError(fmt::format("paratrain plan: needs parameters >= 0 ({}), dp >= 1 ({}), K >= 0 ({})",
                                  parameters, dp, state_bytes_per_param));
  if (!(std::isfinite(memory_gib) && memory_gib >= 0 && memory_gib * kGiB < 9.0e18))
    throw ConfigError(fmt::format("paratrain plan: --memory-gb {} must be a finite number of GiB >= 0 "
                                  "(0 = no budget)", memory_gib));
  MemoryPlan plan;
  plan.parameters = parameters;
  plan.dp = dp;
  plan.shard_elements = (parameters + dp - 1) / dp;
  plan.state_bytes_per_param = state_bytes_per_param;
  plan.budget_bytes = static_cast<int64_t>(std::floor(memory_gib * kGiB));
  for (int stage = 0; stage <= 3; ++stage) {
    StageMemory s = stage_memory(stage, parameters, dp, state_bytes_per_param);
    s.fits = plan.budget_bytes == 0 || checked_add(s.total_bytes, extra_bytes[stage]) <= plan.budget_bytes;
    if (plan.budget_bytes > 0 && s.fits && plan.lowest_fitting_stage < 0) plan.lowest_fitting_stage = stage;
    plan.stages.push_back(s);
  }
  if (plan.budget_bytes > 0 && plan.lowest_fitting_stage < 0) {
    // Stage 3 per rank is ceil(Ψ/N) * (8 + K) bytes: the fewest N that fits.
    const int64_t per_element = 2 * kFp32 + state_bytes_per_param;
    const int64_t max_elements = std::max<int64_t>(0, plan.budget_bytes - extra_bytes[3]) / per_element;
    if (max_elements > 0) plan.dp_needed_for_stage3 = (parameters + max_elements - 1) / max_elements;
  }
  plan.activations.modelled = false;  // the config's overload plans them
  plan.notes.push_back(
      "not counted: ZeRO-1/2's parameter all-gather after the step (4Ψ + 4Ψ/N, when the activations are "
      "gone), backward's other temporaries, the allocator's overhead and memory that is not tensors; "
      "`paratrain plan --measure` shows what they add on this machine");
  return plan;
}

int64_t bytes_beyond_state(const MemoryPlan& p, int stage) {
  const auto& a = p.activations;
  const int64_t buffers = p.stages.at(static_cast<size_t>(stage)).buffer_bytes;
  if (!a.modelled) return buffers;
  return checked_add(checked_add(buffers, a.total_bytes), checked_add(a.data_bytes, a.transient_bytes));
}

std::string format_plan(const MemoryPlan& p) {
  std::string out = fmt::format(
      "paratrain plan: {} with Ψ = {} parameters, optimizer {} (K = {} bytes of state per parameter in fp32), "
      "N = {} data-parallel rank{}\n",
      p.model.empty() ? "a model" : p.model, with_commas(p.parameters), p.optimizer.empty() ? "?" : p.optimizer,
      p.state_bytes_per_param, p.dp, p.dp == 1 ? "" : "s");
  out += fmt::format("Per-rank bytes; a sharded part rounds up to ceil(Ψ/N) = {} elements per rank.\n",
                     with_commas(p.shard_elements));
  const std::string fit_head = p.budget_bytes > 0 ? fmt::format("fits {}", human(p.budget_bytes)) : "fits";
  out += fmt::format("{:<6} {:>12} {:>12} {:>12} {:>14}  {:<14} | {:>22}\n", "stage", "params", "grads",
                     "optimizer", "total/rank", fit_head, "mixed-precision Adam");
  for (const auto& s : p.stages) {
    out += fmt::format("{:<6} {:>12} {:>12} {:>12} {:>14}  {:<14} | {:>22}\n", s.stage, human(s.params_bytes),
                       human(s.grads_bytes), human(s.optimizer_bytes), human(s.total_bytes),
                       p.budget_bytes > 0 ? (s.fits ? "Y" : "N") : "-", human(s.mixed_total_bytes));
  }
  out += fmt::format(
      "fp32, this CPU build: stage 0 (8+K)Ψ, 1: 8Ψ + KΨ/N, 2: 4Ψ + (4+K)Ψ/N, 3: (8+K)Ψ/N  (K = {})\n"
      "mixed-precision Adam (ZeRO paper, reference): stage 0 16Ψ, 1: 4Ψ + 12Ψ/N, 2: 2Ψ + 14Ψ/N, 3: 16Ψ/N\n",
      p.state_bytes_per_param);
  if (p.budget_bytes > 0) {
    if (p.lowest_fitting_stage >= 0) {
      out += fmt::format("Budget {} per rank: stage {} is the lowest stage that fits ({} per rank; lower "
                         "stages communicate less).\n",
                         human(p.budget_bytes), p.lowest_fitting_stage,
                         human(p.stages[static_cast<size_t>(p.lowest_fitting_stage)].total_bytes +
                               bytes_beyond_state(p, p.lowest_fitting_stage)));
    } else if (p.dp_needed_for_stage3 > 0) {
      out += fmt::format("Budget {} per rank: no stage fits on {} rank{} (stage 3 needs {}); stage 3 fits with "
                         "at least {} data-parallel ranks (dp x cp under context parallelism).\n",
                         human(p.budget_bytes), p.dp, p.dp == 1 ? "" : "s",
                         human(p.stages[3].total_bytes + bytes_beyond_state(p, 3)),
                         p.dp_needed_for_stage3);
    } else if (bytes_beyond_state(p, 3) >= p.budget_bytes) {
      const auto& a = p.activations;
      out += fmt::format("Budget {} per rank: no stage fits, with any number of ranks: besides the model state a "
                         "rank at stage 3 needs {} (activations {}, FSDP's gathered unit and its gradient {}, the "
                         "loader {}, backward's largest new gradient {}); smaller micro-batches, "
                         "train.activation_checkpointing, parallel.tp or smaller units (zero.unit_min_params) "
                         "reduce them.\n",
                         human(p.budget_bytes), human(bytes_beyond_state(p, 3)), human(a.total_bytes),
                         human(p.stages[3].buffer_bytes), human(a.data_bytes), human(a.transient_bytes));
    } else {
      out += fmt::format("Budget {} per rank: no stage fits, with any number of ranks (one parameter's "
                         "state alone needs {} bytes).\n",
                         human(p.budget_bytes), 2 * kFp32 + p.state_bytes_per_param);
    }
  }
  if (p.activations.modelled) {
    const auto& a = p.activations;
    out += fmt::format("Activations (Note [Activation formulas]): {} per micro-batch of {} rows{}, {} in flight{}",
                       human(a.kept_bytes), a.microbatch_rows,
                       a.kept_bytes != a.unrecomputed_bytes
                           ? fmt::format(" ({} without activation checkpointing)", human(a.unrecomputed_bytes))
                           : "",
                       a.in_flight, p.pp > 1 ? fmt::format(" on stage {}", a.stage) : "");
    if (a.recompute_bytes > 0) out += fmt::format(", + {} re-made by one segment's recompute", human(a.recompute_bytes));
    out += fmt::format(": {} per rank; the loader holds {} (Note [Loader bytes]), backward's largest new gradient "
                       "{}.\n",
                       human(a.total_bytes), human(a.data_bytes), human(a.transient_bytes));
    out += fmt::format("{:<6} {:>14} {:>34}\n", "stage", "buffers", "+ buffers, activations, loader, gradient");
    for (const auto& s : p.stages) {
      out += fmt::format("{:<6} {:>14} {:>34}\n", s.stage, human(s.buffer_bytes),
                         human(s.total_bytes + bytes_beyond_state(p, s.stage)));
    }
  }
  for (const auto& note : p.notes) out += "Note: " + note + "\n";
  return out;
}

nlohmann::json plan_to_json(const MemoryPlan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) {
    nlohmann::json row = {{"stage", s.stage},
                          {"params_bytes", s.params_bytes},
                          {"grads_bytes", s.grads_bytes},
                          {"optimizer_bytes", s.optimizer_bytes},
                          {"total_bytes", s.total_bytes},
                          {"buffer_bytes", s.buffer_bytes},
                          {"mixed_precision_adam",
                           {{"params_bytes", s.mixed_params_bytes},
                            {"grads_bytes", s.mixed_grads_bytes},
                            {"optimizer_bytes", s.mixed_optimizer_bytes},
                            {"total_bytes", s.mixed_total_bytes}}}};
    if (p.budget_bytes > 0) row["fits"] = s.fits;
    stages.push_back(row);
  }
  nlohmann::json out = {{"model", p.model},
                        {"parameters", p.parameters},
                        {"tp", p.tp},
                        {"pp", p.pp},
                        {"whole_parameters", p.whole_parameters > 0 ? p.whole_parameters : p.parameters},
                        {"dp", p.dp},
                        {"shard_elements", p.shard_elements},
                        {"optimizer", p.optimizer},
                        {"state_bytes_per_param", p.state_bytes_per_param},
                        {"precision", "fp32"},
                        {"stages", stages},
                        {"notes", p.notes}};
  if (p.activations.modelled) {
    const auto& a = p.activations;
    out["activations"] = {{"microbatch_rows", a.microbatch_rows},   {"stage", a.stage},
                          {"in_flight", a.in_flight},               {"kept_bytes", a.kept_bytes},
                          {"recompute_bytes", a.recompute_bytes},   {"total_bytes", a.total_bytes},
                          {"unrecomputed_bytes", a.unrecomputed_bytes}, {"data_bytes", a.data_bytes},
                          {"transient_bytes", a.transient_bytes}};
  }
  if (p.budget_bytes > 0) {
    out["budget_bytes"] = p.budget_bytes;
    out["lowest_fitting_stage"] =
        p.lowest_fitting_stage >= 0 ? nlohmann::json(p.lowest_fitting_stage) : nlohmann::json(nullptr);
    if (p.lowest_fitting_stage < 0)
      out["dp_needed_for_stage3"] =
          p.dp_needed_for_stage3 > 0 ? nlohmann::json(p.dp_needed_for_stage3) : nlohmann::json(nullptr);
  }
  return out;
}

namespace {

StageMemory stage_memory(int stage, int64_t psi, int64_t dp, int64_t k) {
  const int64_t shard = (psi + dp - 1) / dp;
  // How many elements of each part a rank holds at this stage.
  const int64_t state_elems = stage >= 1 ? shard : psi;
  const int64_t grad_elems = stage >= 2 ? shard : psi;
  const int64_t param_elems = stage >= 3 ? shard : psi;
  StageMemory s;
  s.stage = stage;
  s.params_bytes = checked_mul(param_elems, kFp32);
  s.grads_bytes = checked_mul(grad_elems, kFp32);
  s.optimizer_bytes = checked_mul(state_elems, k);
  s.total_bytes = checked_add(checked_add(s.params_bytes, s.grads_bytes), s.optimizer_bytes);
  s.mixed_params_bytes = checked_mul(param_elems, kMixedParam);
  s.mixed_grads_bytes = checked_mul(grad_elems, kMixedGrad);
  s.mixed_optimizer_bytes = checked_mul(state_elems, kMixedAdamState);
  s.mixed_total_bytes =
      checked_add(checked_add(s.mixed_params_bytes, s.mixed_grads_bytes), s.mixed_optimizer_bytes);
  return s;
}

// "mlp 784-256-128-10", "cnn 1x28x28 conv [32, 64] fc 128-10",
// "gpt 4 layers d 256 4 heads seq 128".
std::string model_name(const TrainConfig& c) {
  if (builds_gpt(c)) {
    return fmt::format("gpt {} layers d {} {} heads seq {}", c.model.layers, c.model.d_model, c.model.heads,
                       c.model.seq_len);
  }
  const bool synthetic = c.data.dataset == "synthetic";
  const int64_t channels = synthetic ? c.data.synthetic_channels : 1;
  const int64_t side = synthetic ? c.data.synthetic_image_size : 28;
  const int64_t classes = synthetic ? c.data.synthetic_classes : 10;
  if (c.model.kind == "mlp") {
    std::string name = fmt::format("mlp {}", channels * side * side);
    for (int64_t h : c.model.hidden) name += fmt::format("-{}", h);
    return name + fmt::format("-{}", classes);
  }
  return fmt::format("{} {}x{}x{} conv [{}] fc {}-{}", c.model.kind, channels, side, side,
                     fmt::join(c.model.channels, ", "), c.model.cnn_hidden, classes);
}

// 940.6 KiB, 3.5 GiB: binary units, one decimal; plain bytes below 1 KiB.
std::string human(int64_t bytes) {
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) v /= 1024.0, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace
}  // namespace paratrain::train

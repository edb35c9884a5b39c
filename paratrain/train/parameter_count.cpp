// The parameter counts behind the planner (memory_plan.h): the whole
// model's, a registered model's (built once, drawing no random numbers),
// and what the fullest rank holds under tensor, pipeline and expert
// parallelism. No training: nothing is run.
#include <algorithm>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/checked_count.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/registry.h"

namespace paratrain::train {
namespace {

using detail::checked_add;
using detail::checked_mul;
int64_t linear_params(int64_t in, int64_t out) { return checked_add(checked_mul(in, out), out); }

// The config's model, built with the default generator's state put back
// after (also when building throws): counting draws no random numbers that
// a run on other ranks (or an uninterrupted run) would not draw.
std::shared_ptr<models::Model> build_without_draws(const TrainConfig& c) {
  auto generator = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  auto restore = [&] {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  };
  try {
    auto model = make_model(c);
    restore();
    return model;
  } catch (...) {
    restore();
    throw;
  }
}

// A registered model has no formula: build one and count.
int64_t registered_parameter_count(const TrainConfig& c) {
  int64_t total = 0;
  for (const auto& p : build_without_draws(c)->parameters()) total = checked_add(total, p.numel());
  return total;
}

// A model other than the GPT under parallel.tp_plan: one tp rank's
// parameters, from the plan's layout of the built model (a split parameter
// holds numel / tp elements per rank).
int64_t planned_parameters_per_rank(const TrainConfig& c) {
  const auto model = build_without_draws(c);
  torch::OrderedDict<std::string, tensor_parallel::ShardSpec> layout;
  try {
    layout = parallelize::plan_layout(*model, tp_plan_of(c), static_cast<int>(c.parallel.tp));
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(fmt::format("parallel.tp_plan: {}", e.what()));
  }
  int64_t total = 0;
  for (const auto& item : layout) {
    int64_t n = 1;
    for (int64_t d : item.value().full_shape) n = checked_mul(n, d);
    total = checked_add(total, item.value().replicated() ? n : n / c.parallel.tp);
  }
  return total;
}

}  // namespace

int64_t gpt_expert_parameters(const TrainConfig& c) {
  if (!builds_gpt(c) || c.model.moe_experts == 0) return 0;
  const int64_t d = c.model.d_model;
  const int64_t expert = checked_add(checked_mul(8 * d, d), 5 * d);  // as the dense MLP
  return checked_mul(checked_mul(c.model.layers / c.model.moe_every, c.model.moe_experts), expert);
}

int64_t parameter_count(const TrainConfig& c) {
  if (find_model(c.model.kind)) return registered_parameter_count(c);
  const bool synthetic = c.data.dataset == "synthetic";
  const int64_t channels = synthetic ? c.data.synthetic_channels : 1;  // as make_model: Fashion-MNIST 1x28x28
  const int64_t side = synthetic ? c.data.synthetic_image_size : 28;
  const int64_t classes = synthetic ? c.data.synthetic_classes : 10;
  int64_t total = 0;
  if (builds_gpt(c)) {
    // wte (byte vocabulary 256, also the head) + wpe + blocks + ln_f. A
    // block: ln1, ln2 (2d each), qkv (3d^2 + 3d), attn.proj (d^2 + d),
    // mlp.fc (4d^2 + 4d), mlp.proj (4d^2 + d).
    const int64_t d = c.model.d_model;
    const int64_t block = checked_add(checked_mul(12 * d, d), 13 * d);
    total = checked_mul(checked_add(256, c.model.seq_len), d);
    total = checked_add(total, checked_mul(c.model.layers, block));
    if (c.model.moe_experts > 0) {
      // A MoE block's MLP is E experts and a router (d E) instead of the
      // dense MLP (8d^2 + 5d): every moe_every-th block (models/gpt.h).
      const int64_t mlp = checked_add(checked_mul(8 * d, d), 5 * d);
      const int64_t moe_layers = c.model.layers / c.model.moe_every;
      total = checked_add(total, checked_mul(moe_layers, checked_mul(d, c.model.moe_experts) - mlp));
      total = checked_add(total, gpt_expert_parameters(c));
    }
    return checked_add(total, 2 * d);
  }
  if (c.model.kind == "mlp") {
    int64_t width = checked_mul(checked_mul(channels, side), side);
    for (int64_t next : c.model.hidden) {
      total = checked_add(total, linear_params(width, next));
      width = next;
    }
    return checked_add(total, linear_params(width, classes));
  }
  if (c.model.kind == "cnn") {
    // conv3x3 (weights c_in*c_out*9, bias c_out), each block halves the side; then fc0, fc1.
    int64_t in = channels, s = side;
    for (int64_t out : c.model.channels) {
      total = checked_add(total, checked_add(checked_mul(checked_mul(in, out), 9), out));
      if (c.model.batchnorm) total = checked_add(total, checked_mul(2, out));  // BatchNorm weight, bias
      in = out;
      s /= 2;
    }
    total = checked_add(total, linear_params(checked_mul(checked_mul(in, s), s), c.model.cnn_hidden));
    return checked_add(total, linear_params(c.model.cnn_hidden, classes));
  }
  throw ConfigError(fmt::format("paratrain plan: model.kind = \"{}\" has no parameter count", c.model.kind));
}

namespace {

// The GPT's layers as the megatron strategy cuts them (models/parallel_gpt.cpp
// layers(): embed = wte + wpe, the blocks, head = ln_f + the tied wte), each
// one tensor-parallel rank's parameters. Megatron's layout: the vocabulary
// rows of wte and the column-parallel qkv and mlp.fc (weights and biases)
// split over tp; the row-parallel attn.proj and mlp.proj split their
// weights' inputs and keep a whole bias; wpe and the LayerNorms whole. A
// MoE block keeps its router and its E/ep experts whole (not split by tp).
struct GptLayers {
  std::vector<double> costs;
  int64_t wte = 0;  // counted in both embed and head
};

// `held`: a MoE block counts this rank's E/ep experts; otherwise all E, as
// the stages are cut (before the experts are split).
GptLayers gpt_layers(const TrainConfig& c, bool held = true) {
  const int64_t t = std::max<int64_t>(1, c.parallel.tp);
  const int64_t d = c.model.d_model;
  const int64_t sharded_block = checked_add(checked_mul(12 * d, d), 7 * d);  // qkv, attn.proj w, fc, mlp.proj w
  const int64_t block = checked_add(sharded_block / t, 6 * d);              // + ln1, ln2, the two row biases
  // qkv, attn.proj's weight split; ln1, ln2, attn.proj's bias whole; the
  // router and this rank's experts (each the dense MLP's size) whole.
  const int64_t experts = held ? c.model.moe_experts / std::max<int64_t>(1, c.parallel.ep) : c.model.moe_experts;
  const int64_t moe_block = checked_add(checked_add(checked_mul(4 * d, d) + 3 * d, 0) / t + 5 * d,
                                        checked_add(checked_mul(d, c.model.moe_experts),
                                                    checked_mul(experts, checked_mul(8 * d, d) + 5 * d)));
  GptLayers g;
  g.wte = checked_mul(256, d) / t;
  g.costs.push_back(static_cast<double>(checked_add(g.wte, checked_mul(c.model.seq_len, d))));
  for (int64_t i = 0; i < c.model.layers; ++i) {
    const bool moe = c.model.moe_experts > 0 && (i + 1) % c.model.moe_every == 0;
    g.costs.push_back(static_cast<double>(moe ? moe_block : block));
  }
  g.costs.push_back(static_cast<double>(checked_add(2 * d, g.wte)));
  return g;
}

}  // namespace

int64_t parameters_per_rank(const TrainConfig& c) {
  const int64_t pp = std::max<int64_t>(1, c.parallel.pp);
  if (!builds_gpt(c) && c.parallel.tp > 1 && !c.parallel.tp_plan.empty()) return planned_parameters_per_rank(c);
  if (builds_gpt(c) && c.parallel.ep > 1 && c.parallel.tp <= 1 && pp <= 1) {  // E / ep experts per MoE layer
    const int64_t experts = gpt_expert_parameters(c);
    return parameter_count(c) - experts + experts / c.parallel.ep;
  }
  if (!builds_gpt(c) || (c.parallel.tp <= 1 && pp <= 1)) return parameter_count(c);
  const GptLayers g = gpt_layers(c);
  const int layers = static_cast<int>(g.costs.size());
  if (pp <= 1) {
    double total = 0;
    for (double x : g.costs) total += x;
    return static_cast<int64_t>(total) - g.wte;  // embed and head share wte
  }
  // The stages as megatron_stages.cpp cuts them: pp * virtual_stages chunks,
  // balanced by these counts (or pipeline.split); rank r holds chunks r,
  // r + pp, ...; a rank holding both embed and head keeps one wte.
  const int chunks = static_cast<int>(pp * std::max<int64_t>(1, c.pipeline.virtual_stages));
  const auto bounds = c.pipeline.split.empty() ? pipeline::balanced_partition(gpt_layers(c, false).costs, chunks)
                                               : pipeline::explicit_partition(c.pipeline.split, layers, chunks);
  int64_t most = 0;
  for (int64_t r = 0; r < pp; ++r) {
    double held = 0;
    bool embed = false, head = false;
    for (int mc = static_cast<int>(r); mc < chunks; mc += static_cast<int>(pp)) {
      for (int j = bounds[mc]; j < bounds[mc + 1]; ++j) {
        held += g.costs[static_cast<size_t>(j)];
        embed = embed || j == 0;
        head = head || j == layers - 1;
      }
    }
    most = std::max(most, static_cast<int64_t>(held) - (embed && head ? g.wte : 0));
  }
  return most;
}

}  // namespace paratrain::train

// ParallelGpt: the GPT with tensor, context and Megatron sequence
// parallelism, as the single-process GPT under its plan. See parallel_gpt.h;
// docs/notes/megatron.md explains the composition.
#include "paratrain/models/parallel_gpt.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/parallelize/sites.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "paratrain/tensor_parallel/layers.h"

namespace paratrain::models {

namespace tpl = tensor_parallel;

// Note [Megatron-SP regions]
// Without SP, activations between the blocks' parallel layers are
// replicated over tp: a column-parallel layer enters with copy_to_region
// (backward: all-reduce of the input gradient) and a row-parallel layer
// leaves with reduce_from_region (forward: all-reduce). With SP they are
// sequence chunks: the entry is gather_from_sequence_region (forward
// all-gather, backward reduce-scatter, which already sums the ranks' partial
// input gradients, so no copy_to_region too) and the exit is
// reduce_scatter_to_sequence_region. The row-parallel bias and the LayerNorms
// then act on a chunk, so their gradients are partial: the strategy sums
// sequence_parallel_params() over tp after backward. The plan's sites
// (parallelize/sites.cpp) implement both regions for any planned model.
parallelize::TpPlan gpt_tp_plan(bool megatron_sp, bool dense_mlp) {
  parallelize::TpPlan plan;
  plan.add("wte", "vocab_embedding")
      .add("blocks.*.attn.qkv", "colwise[parts=3]")  // [q; k; v]: rank r keeps its heads' rows of each
      .add("blocks.*.attn.proj", "rowwise");
  if (dense_mlp) plan.add("blocks.*.mlp.fc", "colwise").add("blocks.*.mlp.proj", "rowwise");
  plan.add("blocks.*.ln1", "sequence_parallel")
      .add("blocks.*.ln2", "sequence_parallel")
      .add("ln_f", "sequence_parallel");
  plan.sequence_parallel = megatron_sp;
  plan.seq_dim = 1;
  return plan;
}

ParallelGpt::ParallelGpt(ParallelGptOptions o) : ParallelGpt(make_gpt(o.gpt), o) {}

ParallelGpt::ParallelGpt(std::shared_ptr<Model> gpt, ParallelGptOptions o)
    : Model("ParallelGpt"), options_(std::move(o)), gpt_(std::move(gpt)) {
  const GptOptions& g = options_.gpt;
  TORCH_CHECK(gpt_ != nullptr, "ParallelGpt: no GPT given");
  TORCH_CHECK(options_.tp.group != nullptr, "ParallelGptOptions.tp.group is null: pass the tensor-parallel group");
  TORCH_CHECK(g.heads > 0 && g.d_model > 0 && g.d_model % g.heads == 0, "ParallelGpt: d_model (", g.d_model,
              ") must be a positive multiple of heads (", g.heads, ")");
  tpl::divide_evenly(g.heads, options_.tp.size(), "heads");
  tpl::divide_evenly(g.vocab, options_.tp.size(), "vocabulary size");
  if (cp_size() > 1) {
    sequence_parallel::check_sequence_split(g.seq_len, cp_size());
    if (g.dropout > 0) {
      throw Error(fmt::format("ParallelGpt: dropout {} with cp = {}: ring attention has no attention dropout; use "
                              "dropout 0",
                              g.dropout, cp_size()));
    }
  }
  if (options_.megatron_sp && options_.tp.size() < 2) {
    throw Error("ParallelGpt: megatron_sp needs a tensor-parallel group of 2 or more ranks");
  }
  // A MoE GPT with moe_every = 1 has no dense MLP for the mlp rules.
  const bool dense_mlp = g.moe_experts == 0 || g.moe_every > 1;
  applied_ = parallelize::parallelize_module(*gpt_, gpt_tp_plan(options_.megatron_sp, dense_mlp),
                                             {.tp = options_.tp, .cp = options_.cp, .seed = options_.seed});
  // The GPT's parameters under their own names (Note [Adopting a module]).
  for (const auto& child : gpt_->named_children()) register_module(child.key(), child.value());
  // Replayed by every recompute of this model's layers: activation
  // checkpointing's, and a pipeline chunk's (pipeline.checkpoint_activations).
  options_.recompute.generators.push_back(*parallelize::region_generator(*gpt_));
  if (options_.recompute.enabled()) {
    std::vector<std::string> names;
    for (const auto& layer : layers()) names.push_back(layer.name);
    segment_of_ = recompute_segments(names, options_.recompute);
  }
}

void ParallelGpt::train(bool on) {
  torch::nn::Module::train(on);
  gpt_->train(on);
}

at::Tensor ParallelGpt::forward(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "ParallelGpt expects token ids [batch, seq / cp], got shape ", tokens.sizes());
  if (options_.megatron_sp) {
    TORCH_CHECK(tokens.size(1) % options_.tp.size() == 0, "ParallelGpt: megatron_sp needs the chunk length ",
                tokens.size(1), " divisible by tp = ", options_.tp.size());
  }
  if (!segment_of_.empty()) return run_layers(layers(), tokens, segment_of_, options_.recompute.generators);
  return gpt_->forward(tokens);
}

}  // namespace paratrain::models

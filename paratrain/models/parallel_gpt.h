// The GPT of gpt.h under tensor parallelism (heads, MLP width and vocabulary
// split over a tp group, Megatron-LM), ring self-attention over a cp group
// (each rank holds one chunk of the sequence) and optionally Megatron
// sequence parallelism (LayerNorm, dropout and residuals on 1/tp of the
// chunk). It is the single-process GPT with gpt_tp_plan() applied
// (parallelize/plan.h), as a user's model takes its plan: one implementation
// of the GPT. Not here: gradient reduction across replicas, the loss, data
// slicing (train/strategies/megatron_strategy.cpp does those).
//
// Parameter names equal the single-process GPT's (wte.weight, wpe.weight,
// blocks.<i>.attn.qkv.weight, ...), so load_full_parameters and
// gather_full_parameters (tensor_parallel/shards.h) convert between the two.
//
// Input: token ids of this cp rank's chunk, [B, S/cp] (positions
// [cp_rank * S/cp, (cp_rank + 1) * S/cp) of the full sequence). Output: this
// tp rank's vocabulary columns of the logits, [B, S/cp, vocab/tp]; feed them
// to tensor_parallel::vocab_parallel_cross_entropy, or gather them.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/models/gpt.h"
#include "paratrain/models/model.h"
#include "paratrain/models/recompute.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/tensor_parallel/context.h"

namespace paratrain::models {

struct ParallelGptOptions {
  GptOptions gpt;
  // The tensor-parallel group (size 1: no tensor parallelism) and the
  // timeout of every collective of the model, forward and backward.
  tensor_parallel::TpContext tp;
  // The ring of context parallelism; nullptr or size 1: the whole sequence
  // on every rank. Must outlive the model and every backward.
  comm::ProcessGroup* cp = nullptr;
  // Megatron-SP inside the tp group (needs tp > 1; (S/cp) % tp == 0).
  bool megatron_sp = false;
  // Base seed of the per-tp-rank stream for attention dropout
  // (tensor_parallel/random.h; parallelize::PlanContext::seed).
  uint64_t seed = 0;
  // Activation checkpointing of the layers (recompute.h). The model adds
  // its attention dropout stream to recompute.generators whatever the mode:
  // options().recompute is what a pipeline chunk of it replays.
  RecomputePolicy recompute = {};
};

// The GPT's tensor-parallel plan: wte vocab_embedding, qkv colwise in three
// parts (q, k, v), attn.proj rowwise, mlp.fc colwise, mlp.proj rowwise, the
// LayerNorms sequence_parallel; with `megatron_sp` the plan's
// sequence_parallel switch on. Without `dense_mlp` (a mixture-of-experts
// GPT whose every block's MLP is a MoE layer) no mlp rules: MoE layers are
// replicated over tp (every tp rank routes the same tokens through whole
// experts).
parallelize::TpPlan gpt_tp_plan(bool megatron_sp, bool dense_mlp = true);

class ParallelGpt : public Model {
 public:
  // Shards `gpt` (a make_gpt model of options.gpt, not wrapped) in place by
  // gpt_tp_plan: every rank of the tp group must have built it from the same
  // seed, and then holds the single-process weights' shards. Throws Error
  // when heads or vocab are not divisible by tp, or cp > 1 with dropout > 0
  // (ring attention has no attention dropout).
  ParallelGpt(std::shared_ptr<Model> gpt, ParallelGptOptions options);
  // Builds the GPT with make_gpt (drawing from torch's default generator) and
  // shards it: load the full weights next (load_full_parameters).
  explicit ParallelGpt(ParallelGptOptions options);

  // tokens: [B, S/cp] this rank's chunk -> logits shard [B, S/cp, vocab/tp].
  at::Tensor forward(const at::Tensor& tokens) override;

  // embed, blocks.<i>, head as in gpt.h, each on this rank's shards: the
  // embedding takes this cp rank's chunk [B, S/cp], the head's output is this
  // rank's logit columns [B, S/cp, vocab/tp]; the head lists wte too (tied:
  // a pipeline sums the copies' gradients). Boundaries carry [B, S/cp, d],
  // or under megatron_sp this tp rank's part [B, S/(cp tp), d]. Each layer
  // runs the model's tp / cp collectives: every rank of those groups must
  // run the same layers in the same order (a pipeline stage's schedule).
  std::vector<Layer> layers() override { return gpt_->layers(); }
  void train(bool on = true) override;

  // Parameters replicated over tp whose gradient each tp rank computes from
  // its sequence part only under megatron_sp (LayerNorms, row-parallel
  // biases): sum their gradients over tp after backward. Empty without SP.
  std::vector<at::Tensor> sequence_parallel_params() const { return applied_.sequence_parallel_params; }

  // options().recompute with this rank's attention dropout stream among its
  // generators: what a pipeline chunk of this model replays.
  const ParallelGptOptions& options() const { return options_; }
  int cp_rank() const { return options_.cp ? options_.cp->rank() : 0; }
  int cp_size() const { return options_.cp ? options_.cp->size() : 1; }

 private:
  ParallelGptOptions options_;
  std::shared_ptr<Model> gpt_;
  parallelize::AppliedPlan applied_;
  std::vector<int> segment_of_;  // activation checkpointing of layers() (empty: none)
};

}  // namespace paratrain::models

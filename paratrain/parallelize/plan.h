// Tensor parallelism for a user's own torch::nn::Module, by a plan: module
// names (glob patterns) mapped to how each is split over the tp group, the
// way PyTorch's parallelize_module and Megatron-LM's layers split a
// transformer (arXiv 1909.08053; Megatron-SP, arXiv 2205.05198).
//
//   paratrain::parallelize::TpPlan plan;
//   plan.add("blocks.*.attn.qkv", "colwise[parts=3]")   // fused [q; k; v]
//       .add("blocks.*.attn.out", "rowwise")
//       .add("blocks.*.mlp.up", "colwise")
//       .add("blocks.*.mlp.down", "rowwise")
//       .add("tok", "vocab_embedding")
//       .add("head", "colwise[gather]");
//   auto applied = paratrain::parallelize::parallelize_module(*model, plan, {.tp = {&tp_group}});
//
// Note [Plans in C++]
// PyTorch swaps a planned submodule for a parallel one and hooks its
// forward. A C++ module calls its members directly (fc(x)), through holders
// nothing outside can re-point, and LibTorch has no forward hooks. So a plan
// changes the planned layers in place and the model's forward says where
// they run: a planned Linear runs as parallelize::linear(*fc, x), an
// Embedding as parallelize::embedding(*tok, ids) (sites.h), the same calls
// paratrain's own GPT makes and the same idea as quantization's activation
// sites. With no plan applied a site is the layer's own forward. In place:
//   - the planned parameters become this rank's shards (set_data, so the
//     module's members, named_parameters() and every optimizer see them),
//     sliced from the weights the module was built with: every rank must
//     build the model from the same seed, and the shards then hold what one
//     process holds (tensor_parallel/shards.h gathers them back);
//   - the plan's state is attached to each module of the tree
//     (tensor_parallel/attached.h): the style a site runs, the tp group, the
//     in-region random stream.
// A layer called directly instead of through its site would run on its shard
// without the collectives; check_sites_ran() after the first forward turns
// that into an error naming the layer (the Trainer calls it).
//
// The styles (StyleSpec::parse, the strings of [parallel.tp_plan]):
//   colwise          Linear split by output rows: input replicated (enters
//                    with copy_to_region: backward all-reduces the input's
//                    gradient), output this rank's columns. [parts=N]: the
//                    output is N equal parts each split (a fused qkv: 3), so
//                    a rank holds its heads of each. [gather]: the output
//                    all-gathered back to full (an LM head before a plain
//                    loss).
//   rowwise          Linear split by input columns: input this rank's
//                    columns (a colwise layer's output), the partial products
//                    all-reduced, the bias (replicated) added once after.
//   vocab_embedding  Embedding split by rows (vocabulary): each rank looks up
//                    its ids, zeros elsewhere, summed over the ranks.
//   sequence_parallel  Any module (LayerNorm, Dropout, RMSNorm...) that under
//                    Megatron-SP runs on this rank's part of the sequence:
//                    its parameters' gradients are partial and must be summed
//                    over tp after backward (AppliedPlan::
//                    sequence_parallel_params). Without SP: replicated.
//   replicate        Every rank holds and runs the whole module (the default
//                    for every module no rule names; naming it documents it).
// With TpPlan::sequence_parallel (Megatron-SP) the activations between the
// parallel layers are split along the sequence: a colwise layer's input is
// all-gathered along it (backward: reduce-scatter), a rowwise layer's sum is
// a reduce-scatter (backward: all-gather), and the model enters the sequence
// split where its forward calls parallelize::enter_sequence_parallel (after
// the embeddings, as Megatron does).
// Not here: gradient reduction over data-parallel replicas and the loss (the
// Trainer's "megatron" strategy), the layers paratrain builds itself
// (tensor_parallel/layers.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor_parallel/context.h"
#include "paratrain/tensor_parallel/shards.h"

namespace paratrain::parallelize {

/// How a module is split over the tp ranks (the styles above).
enum class Style { kReplicate, kColwise, kRowwise, kVocabEmbedding, kSequenceParallel };

/// How one module is split (see the styles above).
struct StyleSpec {
  /// The split (see the styles above).
  Style style = Style::kReplicate;
  /// colwise: equal parts of the output, each split over the ranks.
  int64_t parts = 1;
  /// colwise: all-gather the output's last dimension (a full output).
  bool gather_output = false;

  /// "colwise", "colwise[parts=3]", "colwise[gather]", "rowwise",
  /// "vocab_embedding", "sequence_parallel", "replicate". Throws ConfigError
  /// naming the text and the valid forms.
  static StyleSpec parse(std::string_view text);
  /// The parse()-able text.
  std::string str() const;
  bool operator==(const StyleSpec&) const = default;
};

/// A plan: rules in order, each a pattern over module names and a style.
struct TpPlan {
  /// Patterns match dotted module names atom by atom (fnmatch within an atom:
  /// "blocks.*.mlp.fc" matches "blocks.3.mlp.fc", not "blocks.3.x.mlp.fc").
  std::vector<std::pair<std::string, StyleSpec>> rules;
  /// Megatron-SP inside the tp group (see above).
  bool sequence_parallel = false;
  /// The sequence dimension of the activations under sequence_parallel.
  int64_t seq_dim = 1;
  /// A deliberate defect for tests that must fail without the collective:
  /// colwise layers skip copy_to_region (their input's gradient is then not
  /// summed over the ranks).
  bool defect_skip_input_gradient_sum = false;

  /// Appends a rule; `style` as StyleSpec::parse reads it.
  TpPlan& add(std::string pattern, std::string_view style) {
    rules.emplace_back(std::move(pattern), StyleSpec::parse(style));
    return *this;
  }
  /// Appends a rule.
  TpPlan& add(std::string pattern, StyleSpec style) {
    rules.emplace_back(std::move(pattern), style);
    return *this;
  }
};

/// Where the plan runs.
struct PlanContext {
  /// The tensor-parallel group and the timeout of every collective.
  tensor_parallel::TpContext tp;
  /// The context-parallel ring, for models whose attention splits the
  /// sequence over it (paratrain's GPT: ring attention); plan_context() hands
  /// it to them. nullptr or size 1: none. Not owned.
  comm::ProcessGroup* cp = nullptr;
  /// Base seed of the in-region random stream (tensor_parallel/random.h):
  /// region_generator() draws dropout masks inside the parallel region from
  /// region_seed(seed, tp rank).
  uint64_t seed = 0;
};

/// What parallelize_module did.
struct AppliedPlan {
  /// Every module a rule named (replicate included), by name, in module order.
  std::vector<std::pair<std::string, StyleSpec>> styles;
  /// Under sequence_parallel: the parameters whose gradients are partial over
  /// tp (sequence_parallel modules' and rowwise biases): sum them over tp
  /// after backward (sequence_parallel::sync_sequence_parallel_grads). Empty
  /// otherwise.
  std::vector<at::Tensor> sequence_parallel_params;
  /// Every parameter's shard layout under its full name (shards.h).
  torch::OrderedDict<std::string, tensor_parallel::ShardSpec> layout;
};

/// Applies `plan` to `root` (a module owned by a shared_ptr, every rank's
/// built from the same seed) in place. Collective-free. Throws Error naming
/// the rule or module for: a pattern that matches no module; two rules giving
/// one module different styles; a style the module's type cannot take
/// (colwise/rowwise: torch::nn::Linear; vocab_embedding: torch::nn::Embedding
/// without padding_idx or max_norm); a size not divisible by tp (times
/// parts); a tree that was planned already or holds paratrain's own
/// tensor-parallel layers.
AppliedPlan parallelize_module(torch::nn::Module& root, const TpPlan& plan, const PlanContext& ctx);

/// The layout parallelize_module would give `root` at `tp` ranks, with the
/// same checks, changing nothing (what a memory planner counts: a split
/// parameter holds numel / tp elements per rank).
torch::OrderedDict<std::string, tensor_parallel::ShardSpec> plan_layout(const torch::nn::Module& root,
                                                                        const TpPlan& plan, int tp);

/// After a forward of `root`: throws Error naming every colwise, rowwise or
/// vocab_embedding module whose forward never went through its site (called
/// as fc(x) instead of parallelize::linear(*fc, x), or not called at all),
/// and when sequence_parallel is on but enter_sequence_parallel never ran.
void check_sites_ran(const torch::nn::Module& root);

}  // namespace paratrain::parallelize

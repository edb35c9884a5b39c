// The sites where a model runs its planned layers (Note [Plans in C++],
// plan.h). Each is the layer's own forward when no plan is applied (or the
// plan replicates the layer), so a model written with them trains as before
// on one process and under every other strategy.
//
//   at::Tensor forward(const at::Tensor& x) {
//     namespace pz = paratrain::parallelize;
//     at::Tensor h = pz::enter_sequence_parallel(*this, pz::embedding(*tok, x));
//     ...
//     at::Tensor a = torch::relu(pz::linear(*up, norm(h)));   // colwise
//     h = h + pz::linear(*down, a);                           // rowwise
//   }
//
// Attention over split heads: a colwise qkv gives this rank heads / tp heads;
// count them with local_share(*this, heads, "heads") (an Error naming both
// numbers when they do not split), and draw dropout inside the region from
// region_generator(*this) when it is not null.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string_view>

#include "paratrain/parallelize/plan.h"

namespace paratrain::parallelize {

/// The planned Linear's forward (colwise, rowwise) or layer.forward(x).
at::Tensor linear(torch::nn::LinearImpl& layer, const at::Tensor& x);

/// The planned Embedding's forward (vocab_embedding: its rows, summed over
/// tp) or layer.forward(ids).
at::Tensor embedding(torch::nn::EmbeddingImpl& layer, const at::Tensor& ids);

/// An LM head tied to `embedding`: x @ weight^T. Under vocab_embedding x
/// enters the region (copy_to_region, or the sequence gather under SP) and
/// the result is this rank's vocabulary columns, all-gathered to the full
/// logits when `gather` (what a plain loss needs); paratrain's GPT keeps them
/// split for the vocabulary-parallel cross-entropy.
at::Tensor tied_logits(torch::nn::EmbeddingImpl& embedding, const at::Tensor& x, bool gather = true);

/// Under a plan with sequence_parallel, this tp rank's part of x along the
/// sequence dimension (backward all-gathers); otherwise x. `module`: any
/// module of the planned tree (the caller itself), or one whose children are
/// in it (a program's root module, which the Trainer adopts: the functions
/// below look at the children too).
at::Tensor enter_sequence_parallel(const torch::nn::Module& module, const at::Tensor& x);

/// Under a plan with sequence_parallel, the whole sequence from this rank's
/// part (all-gather; backward keeps this rank's part of the gradient): for a
/// head that needs every position (pooling, a classifier) after the split
/// blocks. Otherwise x.
at::Tensor leave_sequence_parallel(const torch::nn::Module& module, const at::Tensor& x);

/// The plan `module` belongs to, or nullptr (no plan applied).
const PlanContext* plan_context(const torch::nn::Module& module);
/// The tp size of `module`'s plan (1 without one).
int tp_size(const torch::nn::Module& module);
/// total / tp (for heads, channels): Error naming `what` and both numbers
/// when total does not split.
int64_t local_share(const torch::nn::Module& module, int64_t total, std::string_view what);
/// This tp rank's in-region random stream (random.h), or nullptr without a
/// plan: dropout of split heads draws from it so ranks do not share masks.
at::Generator* region_generator(const torch::nn::Module& module);

}  // namespace paratrain::parallelize

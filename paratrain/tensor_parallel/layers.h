// The tensor-parallel layers of Megatron-LM (arXiv 1909.08053): linear layers
// split by output rows or input columns, and an embedding split by vocabulary
// rows, with the vocabulary-parallel cross-entropy that goes with it.
// Each layer keeps the parameter names of its single-process twin (weight,
// bias) and says how its shards map to the full tensors (shards.h), so a model
// can be built plain or tensor-parallel and loaded from the same full weights:
//
//   auto fc = ColumnParallelLinearImpl::from_full(plain->weight, plain->bias, {}, ctx);
//   load_full_parameters(*tp_model, plain_model->named_parameters(), ctx);  // a whole model
//
// The constructors initialize as their single-process twin would (Linear's
// kaiming-uniform, Embedding's N(0, 1)) on the full tensor and keep this
// rank's shard, so ranks at the same RNG state hold shards of the weights a
// plain layer built from that state holds (costs the full tensor once).
//
// Not here: the blocks built from them (parallel_mlp.h, parallel_attention.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <vector>

#include "paratrain/tensor_parallel/context.h"
#include "paratrain/tensor_parallel/shards.h"

namespace paratrain::tensor_parallel {

struct ColumnParallelOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;  // full (single-process) output size
  bool bias = true;
  // Return the full output on every rank (all-gather) instead of this rank's
  // slice. Off inside blocks: the next row-parallel layer takes the slice as is.
  bool gather_output = false;
  // Equal parts of the output that are each split over the ranks (shards.h);
  // 3 for a fused [q; k; v] projection, so a rank holds the same heads of each.
  int64_t groups = 1;
  // false: parameters start as zeros and nothing is drawn from torch's
  // default generator; for a layer that is loaded from full weights next
  // (load_full_parameters). Ranks that are threads of one process share that
  // generator, so a draw here would shift another rank's model init.
  bool initialize = true;
};

// y = x W^T + b with W's rows (outputs) split over the ranks: rank r holds
// out_features / tp rows and computes that slice of y. Input replicated;
// forward enters the region with copy_to_region (backward all-reduces dx).
class ColumnParallelLinearImpl : public torch::nn::Cloneable<ColumnParallelLinearImpl>, public ShardedModule {
 public:
  ColumnParallelLinearImpl(ColumnParallelOptions options, TpContext ctx);
  // Parameters hold this rank's shard of a full weight [out, in] and bias
  // [out] (bias may be undefined when options.bias is false).
  static std::shared_ptr<ColumnParallelLinearImpl> from_full(const at::Tensor& weight, const at::Tensor& bias,
                                                             ColumnParallelOptions options, TpContext ctx);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  std::vector<std::pair<std::string, ShardSpec>> shard_specs() const override;

  ColumnParallelOptions options;
  TpContext ctx;
  at::Tensor weight;  // [out / tp, in]
  at::Tensor bias;    // [out / tp], undefined without bias
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelOptions {
  int64_t in_features = 0;  // full (single-process) input size
  int64_t out_features = 0;
  bool bias = true;
  // The input is already this rank's slice of the last dimension (the output
  // of a ColumnParallelLinear without gather_output). Otherwise the input is
  // replicated and scattered first.
  bool input_is_parallel = true;
  bool initialize = true;  // as ColumnParallelOptions::initialize
};

// y = x W^T + b with W's columns (inputs) split over the ranks: rank r
// multiplies its slice of x by its columns, the partial products are summed
// with reduce_from_region, and the (replicated) bias is added once after the
// sum, so it is neither counted tp times nor given tp-times its gradient.
class RowParallelLinearImpl : public torch::nn::Cloneable<RowParallelLinearImpl>, public ShardedModule {
 public:
  RowParallelLinearImpl(RowParallelOptions options, TpContext ctx);
  static std::shared_ptr<RowParallelLinearImpl> from_full(const at::Tensor& weight, const at::Tensor& bias,
                                                          RowParallelOptions options, TpContext ctx);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  std::vector<std::pair<std::string, ShardSpec>> shard_specs() const override;

  RowParallelOptions options;
  TpContext ctx;
  at::Tensor weight;  // [out, in / tp]
  at::Tensor bias;    // [out], replicated
};
TORCH_MODULE(RowParallelLinear);

struct VocabParallelEmbeddingOptions {
  int64_t num_embeddings = 0;  // full vocabulary; divisible by tp
  int64_t embedding_dim = 0;
  bool initialize = true;  // as ColumnParallelOptions::initialize
};

// An embedding whose vocabulary rows are split over the ranks: rank r holds
// rows [r * V/tp, (r+1) * V/tp). Each rank looks up the tokens in its range,
// writes zeros for the others, and the outputs are summed over the ranks
// (reduce_from_region), so every rank gets every token's row. The parameter
// is named "weight" as torch::nn::Embedding's.
class VocabParallelEmbeddingImpl : public torch::nn::Cloneable<VocabParallelEmbeddingImpl>, public ShardedModule {
 public:
  VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options, TpContext ctx);
  static std::shared_ptr<VocabParallelEmbeddingImpl> from_full(const at::Tensor& weight, TpContext ctx);
  void reset() override;
  // tokens: int64 ids in [0, num_embeddings); output [*tokens.shape, dim].
  at::Tensor forward(const at::Tensor& tokens);
  std::vector<std::pair<std::string, ShardSpec>> shard_specs() const override;
  // This rank's vocabulary range [begin, end).
  int64_t vocab_begin() const;
  int64_t vocab_end() const;

  VocabParallelEmbeddingOptions options;
  TpContext ctx;
  at::Tensor weight;  // [V / tp, dim]
};
TORCH_MODULE(VocabParallelEmbedding);

// VocabParallelEmbedding's forward on a given shard of rows (this rank's
// [num_embeddings / tp, dim], rows [rank * V/tp, (rank + 1) * V/tp)): also
// what a plan's vocab_embedding runs for a sliced torch::nn::Embedding.
at::Tensor vocab_parallel_lookup(const at::Tensor& tokens, const at::Tensor& weight_shard, int64_t num_embeddings,
                                 const TpContext& ctx);

// The logits shard of an LM head tied to a VocabParallelEmbedding: x (hidden
// states, replicated) times this rank's embedding rows. Enters the region
// with copy_to_region; the result feeds vocab_parallel_cross_entropy.
at::Tensor parallel_lm_logits(const at::Tensor& x, const at::Tensor& embedding_shard, const TpContext& ctx);

enum class Reduction { kNone, kMean, kSum };

// Cross-entropy of logits split along the vocabulary (the last dimension):
// logits_shard [..., V/tp] holds rank r's columns [r * V/tp, (r+1) * V/tp);
// targets [...] are global ids. Numerically the same as
// F::cross_entropy(full logits, targets), computed from three all-reduces of
// one value per token (the max, the sum of exponentials, the target logit),
// so no rank holds the full logits. Backward needs no communication: the
// gradient of the shard is softmax - one_hot restricted to the shard.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& targets,
                                        const TpContext& ctx, Reduction reduction = Reduction::kMean);

}  // namespace paratrain::tensor_parallel

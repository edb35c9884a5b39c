// Causal multi-head self-attention with the heads split over the tp ranks
// (Megatron-LM section 3): rank r computes heads [r*h/tp, (r+1)*h/tp).
// qkv = ColumnParallelLinear(d -> 3d, groups = 3): the single-process layer's
// output rows are [q; k; v], each heads x head_dim, so rank r holds the rows
// of its heads in each of q, k and v (not a contiguous third of the rows).
// Attention itself is local to the rank's heads (plain matmul, causal mask,
// softmax, optional dropout on the probabilities); proj =
// RowParallelLinear(d -> d) takes the matching columns and all-reduces.
// Parameter names equal the single-process block's: qkv.weight, qkv.bias,
// proj.weight, proj.bias.
// Not here: ring attention over a split sequence (sequence_parallel/).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "paratrain/tensor_parallel/context.h"
#include "paratrain/tensor_parallel/layers.h"

namespace paratrain::tensor_parallel {

struct ParallelAttentionOptions {
  int64_t d_model = 0;
  int64_t heads = 0;  // divisible by tp (Error naming both otherwise)
  bool bias = true;
  // Dropout on the attention probabilities: inside the tensor-parallel
  // region, so drawn from this rank's own stream (random.h).
  double attention_dropout = 0.0;
  // Base of the per-rank dropout stream: region_seed(seed, tp_rank).
  uint64_t seed = 1234;
};

class ParallelSelfAttentionImpl : public torch::nn::Cloneable<ParallelSelfAttentionImpl> {
 public:
  // Initialized as the single-process layers built from the same RNG state.
  ParallelSelfAttentionImpl(ParallelAttentionOptions options, TpContext ctx);
  // From a single-process attention's parameters, by name (qkv.weight,
  // qkv.bias, proj.weight, proj.bias).
  static std::shared_ptr<ParallelSelfAttentionImpl> from_full(
      const torch::OrderedDict<std::string, at::Tensor>& full, ParallelAttentionOptions options, TpContext ctx);
  void reset() override;
  // x: [batch, seq, d_model], replicated; returns the same shape, replicated.
  at::Tensor forward(const at::Tensor& x);

  int64_t local_heads() const { return options.heads / ctx.size(); }
  int64_t head_dim() const { return options.d_model / options.heads; }

  ParallelAttentionOptions options;
  TpContext ctx;
  ColumnParallelLinear qkv{nullptr};
  RowParallelLinear proj{nullptr};
  at::Generator generator;  // this rank's in-region dropout stream
};
TORCH_MODULE(ParallelSelfAttention);

// Causal attention of already projected heads, q/k/v: [batch, heads, seq,
// head_dim]; returns [batch, heads, seq, head_dim]. The same arithmetic the
// single-process block uses (scores scaled by 1/sqrt(head_dim), -inf above
// the diagonal, softmax over keys), shared so both compute identically.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                            bool training, at::Generator* generator);

}  // namespace paratrain::tensor_parallel

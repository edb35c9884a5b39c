// ParallelSelfAttention: heads split over the tp ranks. See parallel_attention.h.
#include "paratrain/tensor_parallel/parallel_attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/tensor_parallel/random.h"
#include "paratrain/tensor_parallel/shards.h"

namespace paratrain::tensor_parallel {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout,
                            bool training, at::Generator* generator) {
  const int64_t seq = q.size(-2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const at::Tensor future = at::ones({seq, seq}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1);
  if (training && dropout > 0) {
    TORCH_CHECK(generator != nullptr, "causal_attention: dropout needs a generator");
    probs = dropout_with(probs, dropout, training, *generator);
  }
  return at::matmul(probs, v);
}

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(ParallelAttentionOptions options_, TpContext ctx_)
    : options(options_), ctx(ctx_) {
  TORCH_CHECK(ctx.group != nullptr, "TpContext::group is null: pass the tensor-parallel group");
  TORCH_CHECK(options.d_model > 0 && options.heads > 0, "ParallelSelfAttention: d_model and heads must be positive");
  if (options.d_model % options.heads != 0) {
    throw Error(fmt::format("attention: d_model ({}) is not divisible by heads ({})", options.d_model,
                            options.heads));
  }
  divide_evenly(options.heads, ctx.size(), "heads");
  reset();
}

std::shared_ptr<ParallelSelfAttentionImpl> ParallelSelfAttentionImpl::from_full(
    const torch::OrderedDict<std::string, at::Tensor>& full, ParallelAttentionOptions options, TpContext ctx) {
  auto attn = std::make_shared<ParallelSelfAttentionImpl>(options, ctx);
  load_full_parameters(*attn, full, ctx);
  return attn;
}

void ParallelSelfAttentionImpl::reset() {
  ColumnParallelOptions c;
  c.in_features = options.d_model;
  c.out_features = 3 * options.d_model;
  c.bias = options.bias;
  c.groups = 3;  // [q; k; v]: rank r keeps its heads' rows of each
  qkv = register_module("qkv", ColumnParallelLinear(c, ctx));
  RowParallelOptions r;
  r.in_features = options.d_model;
  r.out_features = options.d_model;
  r.bias = options.bias;
  r.input_is_parallel = true;
  proj = register_module("proj", RowParallelLinear(r, ctx));
  generator = make_region_generator(options.seed, ctx.rank());
}

at::Tensor ParallelSelfAttentionImpl::forward(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == options.d_model, "ParallelSelfAttention: expected [batch, seq, ",
              options.d_model, "], got ", x.sizes());
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t heads = local_heads(), hd = head_dim();
  // [batch, seq, 3 * heads * hd] -> three [batch, heads, seq, hd].
  const std::vector<at::Tensor> parts = qkv->forward(x).chunk(3, -1);
  auto split_heads = [&](const at::Tensor& t) { return t.reshape({batch, seq, heads, hd}).transpose(1, 2); };
  at::Tensor y = causal_attention(split_heads(parts[0]), split_heads(parts[1]), split_heads(parts[2]),
                                  options.attention_dropout, is_training(), &generator);
  // Back to [batch, seq, heads * hd]: this rank's columns of the proj input.
  y = y.transpose(1, 2).reshape({batch, seq, heads * hd});
  return proj->forward(y);
}

}  // namespace paratrain::tensor_parallel

// Column/row-parallel linear layers, the vocabulary-parallel embedding and
// cross-entropy. See layers.h for what each computes and why.
#include "paratrain/tensor_parallel/layers.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/init.h>

#include <cmath>

#include "paratrain/core/error.h"
#include "paratrain/tensor_parallel/mappings.h"

namespace paratrain::tensor_parallel {
namespace {

// torch::nn::Linear's initialization (kaiming-uniform weight with a = sqrt(5),
// bias uniform in +-1/sqrt(in)) of the full tensors, so that a layer built
// from the same seed on every rank holds shards of the very weights a
// single-process Linear built from that seed would hold.
// initialize = false: zeros, no draw.
std::pair<at::Tensor, at::Tensor> linear_init(int64_t in, int64_t out, bool bias, bool initialize) {
  if (!initialize) return {at::zeros({out, in}), bias ? at::zeros({out}) : at::Tensor()};
  at::Tensor w = at::empty({out, in});
  torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
  at::Tensor b;
  if (bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    b = at::empty({out}).uniform_(-bound, bound);
  }
  return {w, b};
}

void check_ctx(const TpContext& ctx) {
  TORCH_CHECK(ctx.group != nullptr, "TpContext::group is null: pass the tensor-parallel group");
}

}  // namespace

// ---- ColumnParallelLinear

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelOptions options_, TpContext ctx_)
    : options(options_), ctx(ctx_) {
  check_ctx(ctx);
  TORCH_CHECK(options.in_features > 0 && options.out_features > 0 && options.groups > 0,
              "ColumnParallelLinear: in_features, out_features and groups must be positive");
  TORCH_CHECK(options.groups == 1 || !options.gather_output,
              "ColumnParallelLinear: gather_output with groups > 1 would interleave the parts; gather per part");
  TORCH_CHECK(options.out_features % options.groups == 0, "ColumnParallelLinear: out_features ",
              options.out_features, " is not divisible by groups ", options.groups);
  divide_evenly(options.out_features / options.groups, ctx.size(), "out_features per part");
  reset();
}

std::shared_ptr<ColumnParallelLinearImpl> ColumnParallelLinearImpl::from_full(const at::Tensor& weight,
                                                                              const at::Tensor& bias,
                                                                              ColumnParallelOptions options,
                                                                              TpContext ctx) {
  options.in_features = weight.size(1);
  options.out_features = weight.size(0);
  options.bias = bias.defined();
  auto layer = std::make_shared<ColumnParallelLinearImpl>(options, ctx);
  torch::OrderedDict<std::string, at::Tensor> full;
  full.insert("weight", weight);
  if (bias.defined()) full.insert("bias", bias);
  load_full_parameters(*layer, full, ctx);
  return layer;
}

void ColumnParallelLinearImpl::reset() {
  auto [w, b] = linear_init(options.in_features, options.out_features, options.bias, options.initialize);
  std::vector<std::pair<std::string, ShardSpec>> specs = shard_specs();
  weight = register_parameter("weight", shard_of(w, specs[0].second, ctx.rank(), ctx.size()));
  if (options.bias) bias = register_parameter("bias", shard_of(b, specs[1].second, ctx.rank(), ctx.size()));
}

std::vector<std::pair<std::string, ShardSpec>> ColumnParallelLinearImpl::shard_specs() const {
  std::vector<std::pair<std::string, ShardSpec>> out;
  out.emplace_back("weight", ShardSpec{0, options.groups, {options.out_features, options.in_features}});
  if (options.bias) out.emplace_back("bias", ShardSpec{0, options.groups, {options.out_features}});
  return out;
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(copy_to_region(x, ctx), weight, bias);
  return options.gather_output ? gather_from_region(y, ctx) : y;
}

// ---- RowParallelLinear

RowParallelLinearImpl::RowParallelLinearImpl(RowParallelOptions options_, TpContext ctx_)
    : options(options_), ctx(ctx_) {
  check_ctx(ctx);
  TORCH_CHECK(options.in_features > 0 && options.out_features > 0,
              "RowParallelLinear: in_features and out_features must be positive");
  divide_evenly(options.in_features, ctx.size(), "in_features");
  reset();
}

std::shared_ptr<RowParallelLinearImpl> RowParallelLinearImpl::from_full(const at::Tensor& weight,
                                                                        const at::Tensor& bias,
                                                                        RowParallelOptions options, TpContext ctx) {
  options.in_features = weight.size(1);
  options.out_features = weight.size(0);
  options.bias = bias.defined();
  auto layer = std::make_shared<RowParallelLinearImpl>(options, ctx);
  torch::OrderedDict<std::string, at::Tensor> full;
  full.insert("weight", weight);
  if (bias.defined()) full.insert("bias", bias);
  load_full_parameters(*layer, full, ctx);
  return layer;
}

void RowParallelLinearImpl::reset() {
  auto [w, b] = linear_init(options.in_features, options.out_features, options.bias, options.initialize);
  weight = register_parameter("weight", shard_of(w, shard_specs()[0].second, ctx.rank(), ctx.size()));
  if (options.bias) bias = register_parameter("bias", b);
}

std::vector<std::pair<std::string, ShardSpec>> RowParallelLinearImpl::shard_specs() const {
  // The bias is replicated: not listed.
  return {{"weight", ShardSpec{1, 1, {options.out_features, options.in_features}}}};
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor x_local = options.input_is_parallel ? x : scatter_to_region(x, ctx);
  at::Tensor y = reduce_from_region(at::linear(x_local, weight), ctx);
  return bias.defined() ? y + bias : y;
}

// ---- VocabParallelEmbedding

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options_, TpContext ctx_)
    : options(options_), ctx(ctx_) {
  check_ctx(ctx);
  TORCH_CHECK(options.num_embeddings > 0 && options.embedding_dim > 0,
              "VocabParallelEmbedding: num_embeddings and embedding_dim must be positive");
  divide_evenly(options.num_embeddings, ctx.size(), "vocabulary size");
  reset();
}

std::shared_ptr<VocabParallelEmbeddingImpl> VocabParallelEmbeddingImpl::from_full(const at::Tensor& weight,
                                                                                  TpContext ctx) {
  auto layer = std::make_shared<VocabParallelEmbeddingImpl>(
      VocabParallelEmbeddingOptions{weight.size(0), weight.size(1)}, ctx);
  torch::OrderedDict<std::string, at::Tensor> full;
  full.insert("weight", weight);
  load_full_parameters(*layer, full, ctx);
  return layer;
}

void VocabParallelEmbeddingImpl::reset() {
  // torch::nn::Embedding's initialization: N(0, 1) on the full table.
  const at::Tensor w = options.initialize ? at::randn({options.num_embeddings, options.embedding_dim})
                                         : at::zeros({options.num_embeddings, options.embedding_dim});
  weight = register_parameter("weight", shard_of(w, shard_specs()[0].second, ctx.rank(), ctx.size()));
}

std::vector<std::pair<std::string, ShardSpec>> VocabParallelEmbeddingImpl::shard_specs() const {
  return {{"weight", ShardSpec{0, 1, {options.num_embeddings, options.embedding_dim}}}};
}

int64_t VocabParallelEmbeddingImpl::vocab_begin() const {
  return ctx.rank() * (options.num_embeddings / ctx.size());
}
int64_t VocabParallelEmbeddingImpl::vocab_end() const {
  return vocab_begin() + options.num_embeddings / ctx.size();
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& tokens) {
  return vocab_parallel_lookup(tokens, weight, options.num_embeddings, ctx);
}

at::Tensor vocab_parallel_lookup(const at::Tensor& tokens, const at::Tensor& weight_shard, int64_t num_embeddings,
                                 const TpContext& ctx) {
  TORCH_CHECK(tokens.scalar_type() == at::kLong, "VocabParallelEmbedding: tokens must be int64");
  // A token outside the vocabulary would be zeros on every rank (no error,
  // unlike Embedding): check it here.
  if (tokens.numel() > 0) {
    const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < num_embeddings, "VocabParallelEmbedding: token ids in [", lo, ", ", hi,
                "] outside the vocabulary [0, ", num_embeddings, ")");
  }
  if (ctx.size() == 1) return at::embedding(weight_shard, tokens);
  const int64_t begin = weight_shard.size(0) * ctx.rank(), end = begin + weight_shard.size(0);
  const at::Tensor outside = (tokens < begin) | (tokens >= end);
  const at::Tensor local = (tokens - begin).masked_fill(outside, 0);
  const at::Tensor rows = at::embedding(weight_shard, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_region(rows, ctx);
}

at::Tensor parallel_lm_logits(const at::Tensor& x, const at::Tensor& embedding_shard, const TpContext& ctx) {
  return at::linear(copy_to_region(x, ctx), embedding_shard);
}

// ---- vocab_parallel_cross_entropy

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Per-token loss log(sum_j exp(z_j)) - z_t over the full vocabulary, with
// z = logits - max for stability; each rank holds a slice of the j's.
class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* autograd, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t group_address, int64_t timeout_ms) {
    const TpContext ctx{reinterpret_cast<comm::ProcessGroup*>(group_address), std::chrono::milliseconds(timeout_ms)};
    const int64_t shard = logits.size(-1);
    const int64_t begin = ctx.rank() * shard;

    at::Tensor max = std::get<0>(logits.max(-1)).contiguous();
    if (ctx.size() > 1) ctx.group->all_reduce(max, comm::ReduceOp::kMax)->wait(ctx.timeout);
    const at::Tensor z = logits - max.unsqueeze(-1);

    const at::Tensor outside = (targets < begin) | (targets >= begin + shard);
    const at::Tensor local_target = (targets - begin).masked_fill(outside, 0);
    const at::Tensor target_z = z.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0);
    at::Tensor exp = z.exp();
    // One all-reduce for both per-token sums: [2, tokens...].
    at::Tensor sums = at::stack({exp.sum(-1), target_z}).contiguous();
    if (ctx.size() > 1) ctx.group->all_reduce(sums, comm::ReduceOp::kSum)->wait(ctx.timeout);
    const at::Tensor sum_exp = sums[0];
    const at::Tensor loss = sum_exp.log() - sums[1];

    exp.div_(sum_exp.unsqueeze(-1));  // now the softmax, saved for backward
    autograd->save_for_backward({exp, local_target, outside});
    return loss;
  }

  // d loss_i / d z_ij = softmax_ij - [j == t_i]: local to the shard.
  static variable_list backward(AutogradContext* autograd, variable_list grads) {
    const auto saved = autograd->get_saved_variables();
    at::Tensor grad = saved[0].clone();
    const at::Tensor inside = saved[2].logical_not().to(grad.scalar_type());
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -inside.unsqueeze(-1));
    grad.mul_(grads[0].unsqueeze(-1));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits_shard, const at::Tensor& targets,
                                        const TpContext& ctx, Reduction reduction) {
  check_ctx(ctx);
  TORCH_CHECK(targets.scalar_type() == at::kLong, "vocab_parallel_cross_entropy: targets must be int64");
  TORCH_CHECK(logits_shard.sizes().slice(0, logits_shard.dim() - 1) == targets.sizes(),
              "vocab_parallel_cross_entropy: logits ", logits_shard.sizes(), " do not match targets ",
              targets.sizes());
  const at::Tensor loss = VocabParallelCrossEntropy::apply(logits_shard, targets, reinterpret_cast<int64_t>(ctx.group),
                                                           static_cast<int64_t>(ctx.timeout.count()));
  switch (reduction) {
    case Reduction::kNone: return loss;
    case Reduction::kSum: return loss.sum();
    case Reduction::kMean: return loss.mean();
  }
  return loss;
}

}  // namespace paratrain::tensor_parallel

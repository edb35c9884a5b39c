// ParallelGpt: the GPT with tensor, context and Megatron sequence
// parallelism. See parallel_gpt.h; docs/notes/megatron.md explains the
// composition.
#include "paratrain/models/parallel_gpt.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/sequence_parallel/megatron_sp.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/tensor_parallel/parallel_attention.h"
#include "paratrain/tensor_parallel/random.h"

namespace paratrain::models {
namespace {

namespace tpl = tensor_parallel;
namespace sp = sequence_parallel;

// The parameter holders of one attention and one MLP: the layers of
// tensor_parallel/ (their shard layouts, their names), built without drawing
// weights. The forward is ParallelGpt's, because under Megatron-SP the
// layers' own entry (copy_to_region) and exit (all-reduce) are replaced by
// the sequence gather and reduce-scatter.
struct AttentionParams : torch::nn::Module {
  AttentionParams(int64_t d, const tpl::TpContext& ctx) {
    tpl::ColumnParallelOptions c;
    c.in_features = d;
    c.out_features = 3 * d;
    c.groups = 3;  // [q; k; v]: rank r keeps its heads' rows of each
    c.initialize = false;
    qkv = register_module("qkv", tpl::ColumnParallelLinear(c, ctx));
    tpl::RowParallelOptions r;
    r.in_features = d;
    r.out_features = d;
    r.initialize = false;
    proj = register_module("proj", tpl::RowParallelLinear(r, ctx));
  }
  tpl::ColumnParallelLinear qkv{nullptr};
  tpl::RowParallelLinear proj{nullptr};
};

struct MlpParams : torch::nn::Module {
  MlpParams(int64_t d, const tpl::TpContext& ctx) {
    tpl::ColumnParallelOptions c;
    c.in_features = d;
    c.out_features = 4 * d;
    c.initialize = false;
    fc = register_module("fc", tpl::ColumnParallelLinear(c, ctx));
    tpl::RowParallelOptions r;
    r.in_features = 4 * d;
    r.out_features = d;
    r.initialize = false;
    proj = register_module("proj", tpl::RowParallelLinear(r, ctx));
  }
  tpl::ColumnParallelLinear fc{nullptr};
  tpl::RowParallelLinear proj{nullptr};
};

struct BlockParams : torch::nn::Module {
  BlockParams(int64_t d, const tpl::TpContext& ctx) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    attn = register_module("attn", std::make_shared<AttentionParams>(d, ctx));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    mlp = register_module("mlp", std::make_shared<MlpParams>(d, ctx));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  std::shared_ptr<AttentionParams> attn;
  std::shared_ptr<MlpParams> mlp;
};

}  // namespace

struct ParallelGpt::Parts {
  tpl::VocabParallelEmbedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::vector<std::shared_ptr<BlockParams>> block_list;
  torch::nn::LayerNorm ln_f{nullptr};
  at::Generator attention_dropout;  // this tp rank's in-region stream
  std::vector<int> segment_of;      // activation checkpointing of layers() (empty: none)
};

ParallelGpt::ParallelGpt(ParallelGptOptions o) : Model("ParallelGpt"), options_(o), parts_(std::make_shared<Parts>()) {
  const GptOptions& g = o.gpt;
  TORCH_CHECK(o.tp.group != nullptr, "ParallelGptOptions.tp.group is null: pass the tensor-parallel group");
  TORCH_CHECK(g.heads > 0 && g.d_model > 0 && g.d_model % g.heads == 0, "ParallelGpt: d_model (", g.d_model,
              ") must be a positive multiple of heads (", g.heads, ")");
  tpl::divide_evenly(g.heads, o.tp.size(), "heads");
  tpl::divide_evenly(g.vocab, o.tp.size(), "vocabulary size");
  if (cp_size() > 1) {
    sp::check_sequence_split(g.seq_len, cp_size());
    if (g.dropout > 0) {
      throw Error(fmt::format("ParallelGpt: dropout {} with cp = {}: ring attention has no attention dropout; use "
                              "dropout 0",
                              g.dropout, cp_size()));
    }
  }
  if (o.megatron_sp && o.tp.size() < 2) {
    throw Error("ParallelGpt: megatron_sp needs a tensor-parallel group of 2 or more ranks");
  }
  auto& p = *parts_;
  tpl::VocabParallelEmbeddingOptions e{g.vocab, g.d_model};
  e.initialize = false;
  p.wte = register_module("wte", tpl::VocabParallelEmbedding(e, o.tp));
  // A given weight: Embedding then skips its N(0, 1) draw.
  p.wpe = register_module(
      "wpe", torch::nn::Embedding(torch::nn::EmbeddingOptions(g.seq_len, g.d_model)._weight(
                 torch::zeros({g.seq_len, g.d_model}))));
  p.blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < g.layers; ++i) {
    auto block = std::make_shared<BlockParams>(g.d_model, o.tp);
    p.blocks->push_back(block);
    p.block_list.push_back(block);
  }
  p.ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({g.d_model})));
  p.attention_dropout = tpl::make_region_generator(o.seed, o.tp.rank());
  // Replayed by every recompute of this model's layers: activation
  // checkpointing's, and a pipeline chunk's (pipeline.checkpoint_activations).
  options_.recompute.generators.push_back(p.attention_dropout);
  if (options_.recompute.enabled()) {
    std::vector<std::string> names;
    for (const auto& layer : layers()) names.push_back(layer.name);
    p.segment_of = recompute_segments(names, options_.recompute);
  }
}

std::vector<at::Tensor> ParallelGpt::sequence_parallel_params() const {
  if (!options_.megatron_sp) return {};
  std::vector<at::Tensor> out;
  for (const auto& b : parts_->block_list) {
    for (const auto& t : {b->ln1->weight, b->ln1->bias, b->attn->proj->bias, b->ln2->weight, b->ln2->bias,
                          b->mlp->proj->bias}) {
      out.push_back(t);
    }
  }
  out.push_back(parts_->ln_f->weight);
  out.push_back(parts_->ln_f->bias);
  return out;
}

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
// sequence_parallel_params() over tp after backward.
namespace {

// What one decoder block needs besides its parameters.
struct BlockContext {
  tpl::TpContext tp;
  bool use_sp = false;
  comm::ProcessGroup* cp = nullptr;  // nullptr: the whole sequence here
  int64_t heads = 0;                 // this rank's
  int64_t head_dim = 0;
  double dropout = 0;
  at::Generator attention_dropout;   // this tp rank's in-region stream
};

// One block on h: [B, S, d] (under SP, this rank's part of the sequence).
at::Tensor block_forward(BlockParams& block, at::Tensor h, const BlockContext& c, bool training) {
  const sp::SequenceParallelContext spc{c.tp.group, /*seq_dim=*/1, c.tp.timeout};
  // A LayerNorm output entering a column-parallel layer's matmul (see the note).
  auto enter = [&](const at::Tensor& x) {
    return c.use_sp ? sp::gather_from_sequence_region(x, spc) : tpl::copy_to_region(x, c.tp);
  };
  auto leave = [&](const at::Tensor& partial, const at::Tensor& bias) {
    at::Tensor y =
        c.use_sp ? sp::reduce_scatter_to_sequence_region(partial, spc) : tpl::reduce_from_region(partial, c.tp);
    return y + bias;
  };
  // Attention: this rank's heads, over the whole sequence (ring) or chunk.
  const auto& attn = *block.attn;
  const at::Tensor qkv = at::linear(enter(block.ln1->forward(h)), attn.qkv->weight, attn.qkv->bias);
  const int64_t b = qkv.size(0), s = qkv.size(1);
  const std::vector<at::Tensor> parts = qkv.chunk(3, -1);
  auto split_heads = [&](const at::Tensor& t) { return t.reshape({b, s, c.heads, c.head_dim}).transpose(1, 2); };
  at::Tensor y;
  if (c.cp != nullptr) {
    y = sp::ring_attention(split_heads(parts[0]), split_heads(parts[1]), split_heads(parts[2]), *c.cp,
                           {.causal = true, .scale = std::nullopt, .timeout = c.tp.timeout});
  } else {
    at::Generator gen = c.attention_dropout;
    y = tpl::causal_attention(split_heads(parts[0]), split_heads(parts[1]), split_heads(parts[2]), c.dropout, training,
                              &gen);
  }
  y = y.transpose(1, 2).reshape({b, s, c.heads * c.head_dim});
  h = h + torch::dropout(leave(at::linear(y, attn.proj->weight), attn.proj->bias), c.dropout, training);
  // MLP: fc column-parallel, GELU on the slice, proj row-parallel.
  const auto& mlp = *block.mlp;
  const at::Tensor a = torch::gelu(at::linear(enter(block.ln2->forward(h)), mlp.fc->weight, mlp.fc->bias));
  return h + torch::dropout(leave(at::linear(a, mlp.proj->weight), mlp.proj->bias), c.dropout, training);
}

BlockContext block_context(const ParallelGptOptions& o, comm::ProcessGroup* cp, const at::Generator& gen) {
  return {.tp = o.tp,
          .use_sp = o.megatron_sp,
          .cp = cp != nullptr && cp->size() > 1 ? cp : nullptr,
          .heads = o.gpt.heads / o.tp.size(),
          .head_dim = o.gpt.d_model / o.gpt.heads,
          .dropout = o.gpt.dropout,
          .attention_dropout = gen};
}

}  // namespace

at::Tensor ParallelGpt::forward(const at::Tensor& tokens) {
  const GptOptions& g = options_.gpt;
  auto& p = *parts_;
  const tpl::TpContext& tp = options_.tp;
  const bool use_sp = options_.megatron_sp;
  const sp::SequenceParallelContext spc{tp.group, /*seq_dim=*/1, tp.timeout};
  TORCH_CHECK(tokens.dim() == 2, "ParallelGpt expects token ids [batch, seq / cp], got shape ", tokens.sizes());
  if (!p.segment_of.empty()) return run_layers(layers(), tokens, p.segment_of, options_.recompute.generators);
  const int64_t s = tokens.size(1);
  const int64_t offset = static_cast<int64_t>(cp_rank()) * s;
  TORCH_CHECK(s >= 1 && offset + s <= g.seq_len, "ParallelGpt: chunk of ", s, " tokens at cp rank ", cp_rank(),
              " covers positions up to ", offset + s, ", beyond model.seq_len ", g.seq_len);
  if (use_sp) {
    TORCH_CHECK(s % tp.size() == 0, "ParallelGpt: megatron_sp needs the chunk length ", s,
                " divisible by tp = ", tp.size());
  }
  const at::Tensor ids = tokens.to(torch::kLong);
  const at::Tensor positions =
      torch::arange(offset, offset + s, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
  at::Tensor h = torch::dropout(p.wte->forward(ids) + p.wpe->forward(positions), g.dropout, is_training());
  if (use_sp) h = sp::scatter_to_sequence_region(h, spc);
  const BlockContext c = block_context(options_, options_.cp, p.attention_dropout);
  for (const auto& block : p.block_list) h = block_forward(*block, h, c, is_training());
  // The tied head: this rank's vocabulary rows of wte.
  const at::Tensor x = p.ln_f->forward(h);
  return at::linear(use_sp ? sp::gather_from_sequence_region(x, spc) : tpl::copy_to_region(x, tp), p.wte->weight);
}

// As the single-process GPT's layers (gpt.h): embed, blocks.<i>, head, the
// head holding this rank's vocabulary rows of wte (tied), giving this rank's
// logit columns. A boundary carries what forward() carries between blocks:
// [B, S/cp, d], this cp rank's chunk (the embedding adds its positions, the
// blocks run ring attention over cp), replicated over tp; under Megatron-SP
// this tp rank's part of it, [B, S/(cp tp), d] (the embedding scatters, the
// head gathers), as Megatron-LM sends sequence-parallel activations between
// stages.
std::vector<Layer> ParallelGpt::layers() {
  auto& p = *parts_;
  const GptOptions g = options_.gpt;
  const tpl::TpContext tp = options_.tp;
  const bool use_sp = options_.megatron_sp;
  const sp::SequenceParallelContext spc{tp.group, /*seq_dim=*/1, tp.timeout};
  const int64_t cp_rank = this->cp_rank();
  std::vector<Layer> out;
  out.push_back({"embed",
                 {{"wte", p.wte.ptr()}, {"wpe", p.wpe.ptr()}},
                 [wte = p.wte, wpe = p.wpe, g, use_sp, spc, cp_rank](const at::Tensor& tokens) mutable {
                   const int64_t s = tokens.size(1), offset = cp_rank * s;
                   TORCH_CHECK(s >= 1 && offset + s <= g.seq_len, "ParallelGpt: chunk of ", s, " tokens at cp rank ",
                               cp_rank, " covers positions up to ", offset + s, ", beyond model.seq_len ", g.seq_len);
                   const at::Tensor positions = torch::arange(
                       offset, offset + s, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
                   at::Tensor h = torch::dropout(wte->forward(tokens.to(torch::kLong)) + wpe->forward(positions),
                                                 g.dropout, wte->is_training());
                   return use_sp ? sp::scatter_to_sequence_region(h, spc) : h;
                 }});
  const BlockContext c = block_context(options_, options_.cp, p.attention_dropout);
  for (size_t i = 0; i < p.block_list.size(); ++i) {
    auto block = p.block_list[i];
    const std::string name = "blocks." + std::to_string(i);
    out.push_back({name, {{name, block}}, [block, c](const at::Tensor& h) {
                     return block_forward(*block, h, c, block->is_training());
                   }});
  }
  out.push_back({"head",
                 {{"ln_f", p.ln_f.ptr()}, {"wte", p.wte.ptr()}},
                 [ln_f = p.ln_f, wte = p.wte, tp, use_sp, spc](const at::Tensor& h) mutable {
                   const at::Tensor x = ln_f->forward(h);
                   return at::linear(use_sp ? sp::gather_from_sequence_region(x, spc) : tpl::copy_to_region(x, tp),
                                     wte->weight);
                 }});
  return out;
}

}  // namespace paratrain::models

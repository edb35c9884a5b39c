// make_gpt: the GPT of gpt.h. Attention is written out (matmul, causal mask,
// softmax) because LibTorch 1.13 has no fused scaled-dot-product attention in
// C++; the mask is built per forward rather than kept as a buffer, so
// checkpoints and DDP's buffer broadcast hold parameters only. Its layers run
// at the sites of parallelize/sites.h, so the tensor-parallel GPT is this
// model under gpt_tp_plan() (parallel_gpt.h), not a second implementation.
#include "paratrain/models/gpt.h"
#include "paratrain/models/skeleton.h"

#include "paratrain/moe/expert_parallel.h"

#include "paratrain/models/linear_site.h"
#include "paratrain/parallelize/sites.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "paratrain/tensor_parallel/random.h"

#include <cmath>
#include <limits>
#include <string>

#include <torch/torch.h>

namespace paratrain::models {
namespace {

class CausalSelfAttention : public torch::nn::Module {
 public:
  CausalSelfAttention(int64_t d, int64_t heads, double dropout) : heads_(heads), dropout_(dropout) {
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
  }

  // x: [B, S, d] -> [B, S, d]. Under a tensor-parallel plan qkv is colwise in
  // three parts: this rank's heads of q, k and v; proj is rowwise.
  at::Tensor forward(const at::Tensor& x) {
    const int64_t hd = x.size(2) / heads_;
    const int64_t heads = parallelize::local_share(*this, heads_, "heads");
    // [B, S, 3 h hd] -> 3 x [B, S, h, hd] -> [B, h, S, hd]. Under Megatron-SP
    // x holds a part of the sequence and qkv's output all of it.
    const at::Tensor all = linear_site(*qkv, x);
    const int64_t b = all.size(0), s = all.size(1);
    auto parts = all.split(heads * hd, /*dim=*/2);
    auto split_heads = [&](const at::Tensor& t) { return t.view({b, s, heads, hd}).transpose(1, 2); };
    const at::Tensor q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);
    at::Tensor y;
    const parallelize::PlanContext* plan = parallelize::plan_context(*this);
    if (plan != nullptr && plan->cp != nullptr && plan->cp->size() > 1) {
      // Context parallelism: this rank holds one chunk of the sequence.
      y = sequence_parallel::ring_attention(q, k, v, *plan->cp,
                                            {.causal = true, .scale = std::nullopt, .timeout = plan->tp.timeout});
    } else {
      at::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
      // Position t attends to 0..t: mask the strict upper triangle.
      const at::Tensor future =
          torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
      att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
      // Split heads draw their masks from this tp rank's own stream
      // (tensor_parallel/random.h).
      if (at::Generator* gen = parallelize::region_generator(*this)) {
        att = tensor_parallel::dropout_with(att, dropout_, is_training(), *gen);
      } else {
        att = torch::dropout(att, dropout_, is_training());
      }
      y = torch::matmul(att, v);
    }
    return linear_site(*proj, y.transpose(1, 2).contiguous().view({b, s, heads * hd}));
  }

  torch::nn::Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t heads_;
  double dropout_;
};

class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(int64_t d) {
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    proj = register_module("proj", torch::nn::Linear(4 * d, d));
  }
  at::Tensor forward(const at::Tensor& x) {
    return linear_site(*proj, torch::gelu(linear_site(*fc, x)));
  }

  torch::nn::Linear fc{nullptr}, proj{nullptr};
};

class Block : public torch::nn::Module {
 public:
  // `experts`: a mixture-of-experts layer as the MLP (same name, "mlp").
  Block(int64_t d, int64_t heads, double dropout, std::shared_ptr<moe::Moe> experts = nullptr) : dropout_(dropout) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(d, heads, dropout));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    if (experts) {
      moe = register_module("mlp", std::move(experts));
    } else {
      mlp = register_module("mlp", std::make_shared<Mlp>(d));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + torch::dropout(attn->forward(ln1->forward(x)), dropout_, is_training());
    const at::Tensor in = ln2->forward(h);
    return h + torch::dropout(moe ? moe->forward(in) : mlp->forward(in), dropout_, is_training());
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Mlp> mlp;       // dense blocks
  std::shared_ptr<moe::Moe> moe;  // mixture-of-experts blocks

 private:
  double dropout_;
};

class Gpt final : public Model {
 public:
  explicit Gpt(const GptOptions& o) : Model("Gpt"), options_(o) {
    TORCH_CHECK(o.vocab > 0, "GptOptions.vocab must be > 0, got ", o.vocab);
    TORCH_CHECK(o.seq_len > 0, "GptOptions.seq_len must be > 0, got ", o.seq_len);
    TORCH_CHECK(o.layers > 0, "GptOptions.layers must be > 0, got ", o.layers);
    TORCH_CHECK(o.heads > 0 && o.d_model > 0 && o.d_model % o.heads == 0, "GptOptions.d_model (", o.d_model,
                ") must be a positive multiple of heads (", o.heads, ")");
    TORCH_CHECK(o.dropout >= 0 && o.dropout < 1, "GptOptions.dropout must be in [0, 1), got ", o.dropout);
    // Each layer given up as soon as it exists when building a skeleton
    // (Note [Skeleton models]); otherwise skeletonize() does nothing.
    wte = register_module("wte", torch::nn::Embedding(o.vocab, o.d_model));
    skeletonize(*wte);
    wpe = register_module("wpe", torch::nn::Embedding(o.seq_len, o.d_model));
    skeletonize(*wpe);
    drop = register_module("drop", torch::nn::Dropout(o.dropout));
    blocks = register_module("blocks", torch::nn::ModuleList());
    TORCH_CHECK(o.moe_experts >= 0 && o.moe_every >= 1, "GptOptions: moe_experts must be >= 0 and moe_every >= 1");
    for (int64_t i = 0; i < o.layers; ++i) {
      std::shared_ptr<moe::Moe> experts;
      if (o.moe_experts > 0 && (i + 1) % o.moe_every == 0) {
        experts = std::make_shared<moe::Moe>(moe::MoeOptions{.d_model = o.d_model,
                                                             .hidden = 4 * o.d_model,
                                                             .experts = o.moe_experts,
                                                             .top_k = o.moe_top_k,
                                                             .capacity_factor = o.moe_capacity_factor});
      }
      auto block = std::make_shared<Block>(o.d_model, o.heads, o.dropout, std::move(experts));
      skeletonize(*block);
      blocks->push_back(std::move(block));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    skeletonize(*ln_f);
    if (!building_skeleton()) init_weights();
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    at::Tensor h = tokens;
    for (const auto& layer : layers()) h = layer.forward(h);
    return h;
  }

  // "embed" (wte, wpe, dropout), "blocks.<i>", "head" (ln_f and the tied
  // wte): forward() is exactly their composition.
  std::vector<Layer> layers() override {
    std::vector<Layer> out;
    const int64_t seq_len = options_.seq_len;
    out.push_back({"embed",
                   {{"wte", wte.ptr()}, {"wpe", wpe.ptr()}, {"drop", drop.ptr()}},
                   [wte = wte, wpe = wpe, drop = drop, seq_len](const at::Tensor& tokens) mutable {
                     TORCH_CHECK(tokens.dim() == 2, "Gpt expects token ids [batch, seq], got shape ",
                                 tokens.sizes());
                     // Under context parallelism the tokens are this cp rank's chunk of the sequence.
                     const parallelize::PlanContext* plan = parallelize::plan_context(*wte);
                     const int64_t s = tokens.size(1);
                     const int64_t offset = plan != nullptr && plan->cp != nullptr ? plan->cp->rank() * s : 0;
                     TORCH_CHECK(s >= 1 && offset + s <= seq_len, "Gpt: positions [", offset, ", ", offset + s,
                                 ") of a sequence of length ", s,
                                 offset > 0 ? " (this context-parallel rank's chunk)" : "",
                                 " are outside [0, ", seq_len, ") (model.seq_len)");
                     TORCH_CHECK(!at::isFloatingType(tokens.scalar_type()), "Gpt expects integer token ids, got ",
                                 tokens.scalar_type());
                     const at::Tensor ids = tokens.to(torch::kLong);
                     const at::Tensor positions = torch::arange(
                         offset, offset + s, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
                     at::Tensor h = drop->forward(parallelize::embedding(*wte, ids) + wpe->forward(positions));
                     // Megatron-SP: the blocks run on this tp rank's part of the sequence.
                     return parallelize::enter_sequence_parallel(*wte, h);
                   }});
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<Block>(i);
      const std::string name = "blocks." + std::to_string(i);
      out.push_back({name, {{name, block}}, [block](const at::Tensor& h) { return block->forward(h); }});
    }
    // The tied head: logits = ln_f(h) @ wte.weight^T, no bias. It names wte
    // as the embedding does, so a pipeline's last stage holds a copy of the
    // weight under its one name (pipeline/tied.h sums the copies' gradients).
    out.push_back({"head",
                   {{"ln_f", ln_f.ptr()}, {"wte", wte.ptr()}},
                   [ln_f = ln_f, wte = wte](const at::Tensor& h) mutable {
                     // Under a tensor-parallel plan: this rank's vocabulary
                     // columns, for the vocabulary-parallel cross-entropy.
                     return parallelize::tied_logits(*wte, ln_f->forward(h), /*gather=*/false);
                   }});
    return out;
  }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  void init_weights() {
    torch::NoGradGuard no_grad;
    const double init_std = 0.02;
    const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(options_.layers));
    wte->weight.normal_(0, init_std);
    wpe->weight.normal_(0, init_std);
    for (const auto& module : *blocks) {
      auto* block = module->as<Block>();
      std::vector<std::pair<torch::nn::Linear*, bool>> linears{{&block->attn->qkv, false}, {&block->attn->proj, true}};
      if (block->mlp) {
        linears.push_back({&block->mlp->fc, false});
        linears.push_back({&block->mlp->proj, true});
      } else {
        // A MoE block: each expert as the dense MLP, the router as a
        // projection (GPT-2's 0.02).
        block->moe->router->weight.normal_(0, init_std);
        for (const auto& expert : block->moe->named_children()["experts"]->children()) {
          auto* e = expert->as<moe::ExpertImpl>();
          linears.push_back({&e->fc, false});
          linears.push_back({&e->proj, true});
        }
      }
      for (auto [linear, residual] : linears) {
        (*linear)->weight.normal_(0, residual ? residual_std : init_std);
        (*linear)->bias.zero_();
      }
    }
    // LayerNorms keep LibTorch's init: weight 1, bias 0.
  }

  GptOptions options_;
};

}  // namespace

std::shared_ptr<Model> make_gpt(const GptOptions& options) { return std::make_shared<Gpt>(options); }

std::vector<std::pair<std::string, std::shared_ptr<moe::Moe>>> moe_layers(torch::nn::Module& model) {
  return moe::find_moe_layers(model);
}

}  // namespace paratrain::models

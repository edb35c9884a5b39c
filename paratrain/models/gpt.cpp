// make_gpt: the GPT of gpt.h. Attention is written out (matmul, causal mask,
// softmax) because LibTorch 1.13 has no fused scaled-dot-product attention in
// C++; the mask is built per forward rather than kept as a buffer, so
// checkpoints and DDP's buffer broadcast hold parameters only.
#include "paratrain/models/gpt.h"
#include "paratrain/quant/activations.h"

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

  // x: [B, S, d] -> [B, S, d]
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), s = x.size(1), d = x.size(2), hd = d / heads_;
    // [B, S, 3d] -> 3 x [B, S, H, hd] -> [B, H, S, hd]
    auto parts = quant::linear(*qkv, x).split(d, /*dim=*/2);
    auto heads = [&](const at::Tensor& t) { return t.view({b, s, heads_, hd}).transpose(1, 2); };
    const at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    at::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    // Position t attends to 0..t: mask the strict upper triangle.
    const at::Tensor future = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
    att = torch::dropout(att, dropout_, is_training());
    at::Tensor y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, s, d});
    return quant::linear(*proj, y);
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
    return quant::linear(*proj, torch::gelu(quant::linear(*fc, x)));
  }

  torch::nn::Linear fc{nullptr}, proj{nullptr};
};

class Block : public torch::nn::Module {
 public:
  Block(int64_t d, int64_t heads, double dropout) : dropout_(dropout) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(d, heads, dropout));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    mlp = register_module("mlp", std::make_shared<Mlp>(d));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + torch::dropout(attn->forward(ln1->forward(x)), dropout_, is_training());
    return h + torch::dropout(mlp->forward(ln2->forward(h)), dropout_, is_training());
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<Mlp> mlp;

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
    wte = register_module("wte", torch::nn::Embedding(o.vocab, o.d_model));
    wpe = register_module("wpe", torch::nn::Embedding(o.seq_len, o.d_model));
    drop = register_module("drop", torch::nn::Dropout(o.dropout));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.layers; ++i) blocks->push_back(std::make_shared<Block>(o.d_model, o.heads, o.dropout));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    init_weights();
  }

  at::Tensor forward(const at::Tensor& tokens) override {
    TORCH_CHECK(tokens.dim() == 2, "Gpt expects token ids [batch, seq], got shape ", tokens.sizes());
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
                     const int64_t s = tokens.size(1);
                     TORCH_CHECK(s >= 1 && s <= seq_len, "Gpt: sequence length ", s, " is outside [1, ", seq_len,
                                 "] (model.seq_len)");
                     TORCH_CHECK(!at::isFloatingType(tokens.scalar_type()), "Gpt expects integer token ids, got ",
                                 tokens.scalar_type());
                     const at::Tensor ids = tokens.to(torch::kLong);
                     const at::Tensor positions =
                         torch::arange(s, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
                     return drop->forward(wte->forward(ids) + wpe->forward(positions));
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
                     return torch::nn::functional::linear(ln_f->forward(h), wte->weight);
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
      for (torch::nn::Linear* linear : {&block->attn->qkv, &block->attn->proj, &block->mlp->fc, &block->mlp->proj}) {
        const bool residual = linear == &block->attn->proj || linear == &block->mlp->proj;
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

}  // namespace paratrain::models

// A small transformer written as a LibTorch user writes one (post-norm
// blocks, separate q/k/v projections, a gated MLP, an untied head), with
// its layers at the tensor-parallel plan's sites, its plan, and token data:
// shared by tests/train/tp_plan_test.cpp and tp_plan_trainer_test.cpp.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "paratrain/data/dataset.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/parallelize/sites.h"

namespace paratrain::testing::tiny_lm {

namespace pz = paratrain::parallelize;

constexpr int64_t kVocab = 64, kSeq = 16, kDim = 32, kHeads = 4;

// Attention with separate q, k, v and an output projection; this rank's
// heads under a plan.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl()
      : q(register_module("q", torch::nn::Linear(kDim, kDim))),
        k(register_module("k", torch::nn::Linear(kDim, kDim))),
        v(register_module("v", torch::nn::Linear(kDim, kDim))),
        out(register_module("out", torch::nn::Linear(kDim, kDim))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t heads = pz::local_share(*this, kHeads, "heads"), hd = kDim / kHeads;
    auto split = [&](const at::Tensor& t) { return t.view({t.size(0), t.size(1), heads, hd}).transpose(1, 2); };
    const at::Tensor qh = split(pz::linear(*q, x)), kh = split(pz::linear(*k, x)), vh = split(pz::linear(*v, x));
    const int64_t s = qh.size(2);
    at::Tensor att = torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    const auto future = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = att.masked_fill(future, -INFINITY).softmax(-1);
    const at::Tensor y = torch::matmul(att, vh).transpose(1, 2).reshape({qh.size(0), s, heads * hd});
    return pz::linear(*out, y);
  }
  torch::nn::Linear q, k, v, out;
};
TORCH_MODULE(Attention);

// A gated MLP: down(silu(gate(x)) * up(x)).
struct GatedMlpImpl : torch::nn::Module {
  GatedMlpImpl()
      : gate(register_module("gate", torch::nn::Linear(kDim, 2 * kDim))),
        up(register_module("up", torch::nn::Linear(kDim, 2 * kDim))),
        down(register_module("down", torch::nn::Linear(2 * kDim, kDim))) {}
  at::Tensor forward(const at::Tensor& x) {
    return pz::linear(*down, torch::silu(pz::linear(*gate, x)) * pz::linear(*up, x));
  }
  torch::nn::Linear gate, up, down;
};
TORCH_MODULE(GatedMlp);

// Post-norm: x = norm(x + f(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : attn(register_module("attn", Attention())),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        mlp(register_module("mlp", GatedMlp())),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = ln1(x + attn(x));
    return ln2(h + mlp(h));
  }
  Attention attn;
  torch::nn::LayerNorm ln1;
  GatedMlp mlp;
  torch::nn::LayerNorm ln2;
};
TORCH_MODULE(Block);

// call_sites = false: the planned head called as head(h), a defect the
// Trainer must catch.
struct TinyLmImpl : torch::nn::Module {
  explicit TinyLmImpl(bool call_sites = true)
      : tok(register_module("tok", torch::nn::Embedding(kVocab, kDim))),
        pos(register_module("pos", torch::nn::Embedding(kSeq, kDim))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(), Block()))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        head(register_module("head", torch::nn::Linear(kDim, kVocab))),
        call_sites_(call_sites) {}
  at::Tensor forward(const at::Tensor& ids) {
    const at::Tensor positions =
        torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    at::Tensor h = pz::embedding(*tok, ids.to(torch::kLong)) + pos(positions);
    h = pz::enter_sequence_parallel(*this, h);
    for (const auto& b : *blocks) h = b->as<BlockImpl>()->forward(h);
    h = ln_f(h);
    // The defect a plan must catch: the planned head called as head(h).
    return call_sites_ ? pz::linear(*head, h) : head(h);
  }
  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
  bool call_sites_;
};

inline std::vector<std::string> plan_entries() {
  return {"tok=vocab_embedding",       "blocks.*.attn.[qkv]=colwise", "blocks.*.attn.out=rowwise",
          "blocks.*.mlp.gate=colwise", "blocks.*.mlp.up=colwise",     "blocks.*.mlp.down=rowwise",
          "blocks.*.ln?=sequence_parallel", "ln_f=sequence_parallel", "head=colwise[gather]"};
}

inline pz::TpPlan plan_of(const std::vector<std::string>& entries) {
  pz::TpPlan plan;
  for (const auto& e : entries) plan.add(e.substr(0, e.find('=')), e.substr(e.find('=') + 1));
  return plan;
}

// Sequences whose next token depends on the last two: something to learn.
inline data::TensorDataset token_rows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = torch::randint(0, kVocab, {n, kSeq + 1}, gen, torch::kLong);
  for (int64_t t = 2; t <= kSeq; ++t) {
    x.select(1, t).copy_((x.select(1, t - 1) * 3 + x.select(1, t - 2)) % kVocab);
  }
  return {x.slice(1, 0, kSeq).contiguous(), x.slice(1, 1, kSeq + 1).contiguous()};
}

}  // namespace paratrain::testing::tiny_lm

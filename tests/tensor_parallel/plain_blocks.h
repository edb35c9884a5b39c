// The single-process blocks the tensor-parallel tests compare with, written
// with the GPT's layout: attn.qkv = Linear(d, 3d) with output rows [q; k; v]
// (each heads x head_dim), attn.proj = Linear(d, d), mlp.fc = Linear(d, 4d),
// mlp.proj = Linear(4d, d). The attention is written out here independently
// of tensor_parallel's causal_attention(), so a shared mistake cannot hide.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace paratrain::tensor_parallel::testing {

struct PlainMlpImpl : torch::nn::Module {
  explicit PlainMlpImpl(int64_t d) {
    fc = register_module("fc", torch::nn::Linear(d, 4 * d));
    proj = register_module("proj", torch::nn::Linear(4 * d, d));
  }
  at::Tensor forward(const at::Tensor& x) { return proj->forward(torch::gelu(fc->forward(x))); }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(PlainMlp);

struct PlainAttentionImpl : torch::nn::Module {
  PlainAttentionImpl(int64_t d, int64_t heads) : heads(heads) {
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads;
    const at::Tensor qkv_out = qkv->forward(x);
    auto head_view = [&](int part) {
      return qkv_out.slice(-1, part * d, (part + 1) * d).view({b, t, heads, hd}).permute({0, 2, 1, 3});
    };
    const at::Tensor q = head_view(0), k = head_view(1), v = head_view(2);
    at::Tensor att = torch::einsum("bhqd,bhkd->bhqk", {q, k}) * (1.0 / std::sqrt(static_cast<double>(hd)));
    const at::Tensor allowed = torch::tril(torch::ones({t, t}));
    att = att.masked_fill(allowed == 0, -1e30).softmax(-1);
    const at::Tensor y = torch::einsum("bhqk,bhkd->bhqd", {att, v}).permute({0, 2, 1, 3}).reshape({b, t, d});
    return proj->forward(y);
  }
  int64_t heads;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(PlainAttention);

inline torch::OrderedDict<std::string, at::Tensor> detached(const torch::nn::Module& m) {
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out.insert(p.key(), p.value().detach().clone());
  return out;
}

}  // namespace paratrain::tensor_parallel::testing

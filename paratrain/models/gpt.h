// A GPT (decoder-only transformer language model, GPT-2 layout): token and
// learned position embeddings, `layers` pre-LayerNorm decoder blocks (causal
// multi-head self-attention, then an MLP d -> 4d -> d with GELU, each inside
// a residual), a final LayerNorm, and an LM head that reuses the token
// embedding's weight (no separate output matrix).
//
// Input: token ids [B, S] (any integer dtype; S <= seq_len). Output: logits
// [B, S, vocab] for the next token at every position; position t only sees
// tokens 0..t. Parameter names (other parts of paratrain shard from them, so
// they are part of the interface):
//   wte.weight [vocab, d]          wpe.weight [seq_len, d]
//   blocks.<i>.ln1.{weight,bias}   blocks.<i>.attn.qkv.{weight [3d, d], bias}
//   blocks.<i>.attn.proj.{weight [d, d], bias}
//   blocks.<i>.ln2.{weight,bias}   blocks.<i>.mlp.fc.{weight [4d, d], bias}
//   blocks.<i>.mlp.proj.{weight [d, 4d], bias}
//   ln_f.{weight,bias}
// qkv's output rows are [q; k; v], each d rows laid out heads x head_dim.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/models/model.h"
#include "paratrain/moe/moe.h"

namespace paratrain::models {

struct GptOptions {
  int64_t vocab = 256;   // byte-level tokens
  int64_t seq_len = 128; // longest context (rows of wpe)
  int64_t layers = 4;
  int64_t d_model = 256;
  int64_t heads = 4;     // must divide d_model
  // Dropout on the embeddings' sum, the attention probabilities and each
  // residual branch's output (GPT-2's three places). Active in train() only.
  double dropout = 0.1;
  // Mixture of experts (moe/moe.h): with moe_experts > 0, blocks
  // moe_every - 1, 2 moe_every - 1, ... have a MoE layer as their MLP,
  // under the same name ("blocks.<i>.mlp": router.weight,
  // experts.<e>.{fc,proj}.{weight,bias}).
  int64_t moe_experts = 0;
  int64_t moe_top_k = 1;
  double moe_capacity_factor = 1.25;
  int64_t moe_every = 2;
};

// The MoE layers of a model made by make_gpt, with their module names, in
// model order (empty for a dense GPT).
std::vector<std::pair<std::string, std::shared_ptr<moe::Moe>>> moe_layers(torch::nn::Module& model);

// Initialisation (GPT-2): weights normal(0, 0.02), biases 0, LayerNorm 1/0,
// and the two projections that write into the residual stream (attn.proj,
// mlp.proj) normal(0, 0.02 / sqrt(2 * layers)) so the residual's variance
// does not grow with depth. Draws from torch's default generator:
// deterministic after torch::manual_seed. Throws c10::Error on bad sizes.
//
// layers(): "embed", "blocks.<i>", "head". The head layer lists wte too (the
// LM head is tied to it): a pipeline gives the last stage its own copy of
// wte.weight, starting equal to the first stage's, and sums the two copies'
// gradients after backward (Megatron's embedding group; pipeline/tied.h).
std::shared_ptr<Model> make_gpt(const GptOptions& options);

}  // namespace paratrain::models

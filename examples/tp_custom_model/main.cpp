// Tensor parallelism for your own transformer: a small language model
// written as any LibTorch module (pre-norm blocks, a gated MLP, an untied
// head) whose layers a plan splits over the ranks of parallel.tp. The plan
// lives in the config ([parallel.tp_plan] in tiny_lm.toml); the model says
// where its planned layers run: parallelize::linear(*layer, x) instead of
// layer(x), parallelize::embedding(*tok, ids) instead of tok(ids). Those
// calls are the layers' own forwards when no plan is applied, so the same
// program trains on one process, under DDP or ZeRO, and at tp = 2.
// Trained on the fortunes (bytes as tokens).
//
//   paratrain launch --nproc-per-node 2 -- ./tp_custom_model tiny_lm.toml parallel.tp=2
//   ./tp_custom_model tiny_lm.toml                       # one process, the same weights
//   paratrain checkpoint compare runs/tiny_lm/version_0/checkpoints/step_00000040 \
//       runs/tiny_lm/version_1/checkpoints/step_00000040 --all
#include <paratrain/paratrain.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace pz = paratrain::parallelize;

struct Dims {
  int64_t vocab = 256, seq = 64, d = 128, heads = 4, layers = 2;
};

// Causal self-attention; under a plan q, k, v are colwise (this rank's
// heads) and out is rowwise. No q/k/v biases (as Llama): a key bias's
// gradient is zero in exact arithmetic (it adds a constant to every score
// of a query), so it would only carry rounding noise.
struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Dims& m)
      : q(register_module("q", torch::nn::Linear(torch::nn::LinearOptions(m.d, m.d).bias(false)))),
        k(register_module("k", torch::nn::Linear(torch::nn::LinearOptions(m.d, m.d).bias(false)))),
        v(register_module("v", torch::nn::Linear(torch::nn::LinearOptions(m.d, m.d).bias(false)))),
        out(register_module("out", torch::nn::Linear(m.d, m.d))),
        heads_(m.heads),
        head_dim_(m.d / m.heads) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t heads = pz::local_share(*this, heads_, "heads");  // heads / tp under a plan
    auto split = [&](const torch::Tensor& t) {
      return t.view({t.size(0), t.size(1), heads, head_dim_}).transpose(1, 2);
    };
    auto qh = split(pz::linear(*q, x)), kh = split(pz::linear(*k, x)), vh = split(pz::linear(*v, x));
    const int64_t s = qh.size(2);
    auto att = torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    const auto future = torch::ones({s, s}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = att.masked_fill(future, -INFINITY).softmax(-1);
    return pz::linear(*out, torch::matmul(att, vh).transpose(1, 2).reshape({x.size(0), s, heads * head_dim_}));
  }
  torch::nn::Linear q, k, v, out;
  int64_t heads_, head_dim_;
};
TORCH_MODULE(Attention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Dims& m)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d})))),
        attn(register_module("attn", Attention(m))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d})))),
        gate(register_module("gate", torch::nn::Linear(m.d, 2 * m.d))),
        up(register_module("up", torch::nn::Linear(m.d, 2 * m.d))),
        down(register_module("down", torch::nn::Linear(2 * m.d, m.d))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(norm1(x));
    const auto h = norm2(x);
    return x + pz::linear(*down, torch::silu(pz::linear(*gate, h)) * pz::linear(*up, h));
  }
  torch::nn::LayerNorm norm1;
  Attention attn;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear gate, up, down;
};
TORCH_MODULE(Block);

struct TinyLmImpl : torch::nn::Module {
  explicit TinyLmImpl(const Dims& m)
      : tok(register_module("tok", torch::nn::Embedding(m.vocab, m.d))),
        pos(register_module("pos", torch::nn::Embedding(m.seq, m.d))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d})))),
        head(register_module("head", torch::nn::Linear(m.d, m.vocab))) {
    for (int64_t i = 0; i < m.layers; ++i) blocks->push_back(Block(m));
  }
  // ids [B, S] -> logits [B, S, vocab] (whole on every rank: the head's
  // plan is colwise[gather]).
  torch::Tensor forward(const torch::Tensor& ids) {
    const auto positions = torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    auto h = pz::embedding(*tok, ids.to(torch::kLong)) + pos(positions);
    h = pz::enter_sequence_parallel(*this, h);  // Megatron-SP: this rank's part of the sequence
    for (const auto& block : *blocks) h = block->as<BlockImpl>()->forward(h);
    return pz::linear(*head, norm(h));
  }
  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(TinyLm);

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG.toml [key=value ...]\n", argv[0]);
    return 2;
  }
  // Registered under a name, so the config's model.kind picks it (and the
  // built-in text dataset may feed it token windows).
  paratrain::register_model("tiny_lm", paratrain::any_module([](const paratrain::TrainConfig& c) {
    Dims m;
    m.seq = c.model.seq_len;
    m.d = c.user.get<int64_t>("d_model");
    m.heads = c.user.get<int64_t>("heads");
    m.layers = c.user.get<int64_t>("layers");
    return TinyLm(m);
  }));
  const auto config = paratrain::load_config(argv[1], std::vector<std::string>(argv + 2, argv + argc));
  paratrain::TrainerParts parts;
  parts.task = paratrain::language_model_task(config.model.seq_len);  // next-byte cross-entropy
  // The data: config.data (the built-in text dataset over the fortunes).

  auto world = paratrain::init_from_env();
  paratrain::Trainer trainer(config, world.group(), parts);
  const auto result = trainer.fit();
  if (world.is_main()) {
    std::printf("%s: %lld steps, last training loss %.4f, run dir %s\n", trainer.strategy_name().c_str(),
                (long long)result.steps, result.last_train_loss, result.run_dir.c_str());
  }
  world.barrier();
  return 0;
}

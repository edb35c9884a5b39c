// A tiny transformer trained with tensor parallelism equals the same model
// trained in one process: vocab-parallel token embedding, a replicated
// position embedding, two pre-LayerNorm blocks (ParallelSelfAttention,
// ParallelMlp), final LayerNorm, LM head tied to the embedding
// (parallel_lm_logits) and vocab_parallel_cross_entropy; plain SGD for a few
// steps on different batches. Compared after training: every parameter,
// gathered to full tensors, and every step's loss, at tp = 2 and 4.
// Tolerance: 1e-5 relative to the largest oracle value (float32 sums in
// another order, compounded over 4 steps; measured margins are printed).
// Negative control: a group that skips copy_to_region's backward all-reduce
// (the only all-reduce in backward) must miss by far more.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <mutex>

#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/parallel_attention.h"
#include "paratrain/tensor_parallel/parallel_mlp.h"
#include "paratrain/tensor_parallel/shards.h"
#include "tests/support/forwarding_group.h"
#include "tests/tensor_parallel/plain_blocks.h"
#include "tests/tensor_parallel/tp_testing.h"

namespace paratrain::tensor_parallel {
namespace {

namespace F = torch::nn::functional;
using testing::detached;
using testing::PlainAttention;
using testing::PlainMlp;
using testing::rel_diff;

constexpr double kTolerance = 1e-5;
constexpr int64_t kVocab = 16, kDim = 16, kHeads = 4, kSeq = 8, kBatch = 2, kSteps = 4;
constexpr double kLr = 0.2;

// One block, generic over the attention and MLP types so the plain and the
// tensor-parallel models share their structure and parameter names.
template <class Attention, class Mlp>
struct BlockImpl : torch::nn::Module {
  BlockImpl(Attention a, Mlp m) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    attn = register_module("attn", a);
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    mlp = register_module("mlp", m);
  }
  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln1->forward(x));
    return x + mlp->forward(ln2->forward(x));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};

// The plain model (tp == nullptr) or the tensor-parallel one.
struct TinyGptImpl : torch::nn::Module {
  TinyGptImpl(const TpContext* tp) : tp(tp ? std::optional<TpContext>(*tp) : std::nullopt) {
    if (tp) {
      wte_tp = register_module("wte", VocabParallelEmbedding(VocabParallelEmbeddingOptions{kVocab, kDim}, *tp));
      for (int i = 0; i < 2; ++i) {
        tp_blocks.push_back(register_module(
            "block" + std::to_string(i),
            std::make_shared<BlockImpl<ParallelSelfAttention, ParallelMlp>>(
                ParallelSelfAttention(ParallelAttentionOptions{kDim, kHeads}, *tp),
                ParallelMlp(ParallelMlpOptions{kDim}, *tp))));
      }
    } else {
      wte = register_module("wte", torch::nn::Embedding(kVocab, kDim));
      for (int i = 0; i < 2; ++i) {
        plain_blocks.push_back(register_module("block" + std::to_string(i),
                                               std::make_shared<BlockImpl<PlainAttention, PlainMlp>>(
                                                   PlainAttention(kDim, kHeads), PlainMlp(kDim))));
      }
    }
    wpe = register_parameter("wpe", torch::randn({kSeq, kDim}) * 0.1);
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
  }

  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor x = (tp ? wte_tp->forward(tokens) : wte->forward(tokens)) + wpe;
    for (auto& b : plain_blocks) x = b->forward(x);
    for (auto& b : tp_blocks) x = b->forward(x);
    x = ln_f->forward(x);
    if (!tp) return F::cross_entropy(at::linear(x, wte->weight).reshape({-1, kVocab}), targets.reshape({-1}));
    return vocab_parallel_cross_entropy(parallel_lm_logits(x, wte_tp->weight, *tp), targets, *tp);
  }

  std::optional<TpContext> tp;
  torch::nn::Embedding wte{nullptr};
  VocabParallelEmbedding wte_tp{nullptr};
  at::Tensor wpe;
  std::vector<std::shared_ptr<BlockImpl<PlainAttention, PlainMlp>>> plain_blocks;
  std::vector<std::shared_ptr<BlockImpl<ParallelSelfAttention, ParallelMlp>>> tp_blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};

struct Batch {
  at::Tensor tokens, targets;
};

// The negative control's group: while `skip` is set, all-reduces still run
// (so the ranks stay in step) but on a scratch copy, leaving the tensor
// unreduced. Set only during backward, where the only all-reduces are
// copy_to_region's.
class SkipAllReduce : public paratrain::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  comm::WorkHandle all_reduce(at::Tensor& t, comm::ReduceOp op) override {
    if (!skip) return ForwardingGroup::all_reduce(t, op);
    scratch_.push_back(t.clone());
    return ForwardingGroup::all_reduce(scratch_.back(), op);
  }
  bool skip = false;

 private:
  std::vector<at::Tensor> scratch_;
};

struct Result {
  double params = 0, losses = 0;
};

Result train_and_compare(int tp, bool break_backward) {
  torch::manual_seed(30);
  auto plain = std::make_shared<TinyGptImpl>(nullptr);
  const auto full = detached(*plain);
  std::vector<Batch> batches;
  for (int s = 0; s < kSteps; ++s) {
    batches.push_back({torch::randint(0, kVocab, {kBatch, kSeq}, torch::kLong),
                       torch::randint(0, kVocab, {kBatch, kSeq}, torch::kLong)});
  }
  std::vector<double> plain_losses;
  torch::optim::SGD plain_opt(plain->parameters(), torch::optim::SGDOptions(kLr));
  for (const Batch& b : batches) {
    plain_opt.zero_grad();
    at::Tensor loss = plain->loss(b.tokens, b.targets);
    loss.backward();
    plain_opt.step();
    plain_losses.push_back(loss.item<double>());
  }

  Result result;
  std::mutex mu;
  paratrain::testing::run_ranks(tp, [&](comm::ProcessGroup& world) {
    SkipAllReduce group(world);
    const TpContext ctx{&group, std::chrono::seconds(30)};
    // The constructor draws random weights; from_full-style loading then
    // overwrites every parameter with the plain model's.
    TinyGptImpl model(&ctx);
    load_full_parameters(model, full, ctx);
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(kLr));
    double loss_diff = 0;
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      at::Tensor loss = model.loss(batches[s].tokens, batches[s].targets);
      group.skip = break_backward;
      loss.backward();
      group.skip = false;
      opt.step();
      loss_diff = std::max(loss_diff, std::abs(loss.item<double>() - plain_losses[s]) / std::abs(plain_losses[s]));
    }
    const auto trained = gather_full_parameters(model, ctx);
    double param_diff = 0;
    for (const auto& p : plain->named_parameters()) param_diff = std::max(param_diff, rel_diff(trained[p.key()], p.value().detach()));
    std::lock_guard<std::mutex> lock(mu);
    result.params = std::max(result.params, param_diff);
    result.losses = std::max(result.losses, loss_diff);
  });
  std::printf("[tp=%d%s] after %lld SGD steps: max relative diff params %.3g, losses %.3g (tolerance %.0e)\n", tp,
              break_backward ? ", backward all-reduce skipped" : "", static_cast<long long>(kSteps), result.params,
              result.losses, kTolerance);
  return result;
}

class TrainingTest : public ::testing::TestWithParam<int> {};

TEST_P(TrainingTest, TwoBlocksTrainedWithSgdEqualSingleProcess) {
  const Result r = train_and_compare(GetParam(), false);
  EXPECT_LE(r.params, kTolerance);
  EXPECT_LE(r.losses, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Tp, TrainingTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

TEST(TrainingNegativeControl, SkippingCopyToRegionBackwardAllReduceBreaksEquality) {
  const Result r = train_and_compare(2, true);
  EXPECT_GT(r.params, 100 * kTolerance);
}

}  // namespace
}  // namespace paratrain::tensor_parallel

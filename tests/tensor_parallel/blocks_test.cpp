// ParallelMlp and ParallelSelfAttention against plain single-process blocks
// written here with the GPT's layout (attn.qkv = Linear(d, 3d) with output
// rows [q; k; v], attn.proj = Linear(d, d), mlp.fc = Linear(d, 4d),
// mlp.proj = Linear(4d, d)), at tp = 2 and 4: output, input gradient and
// every weight gradient gathered back to full tensors. Then a tiny
// transformer (vocab-parallel embedding, two pre-LayerNorm blocks, tied
// vocab-parallel LM head and cross-entropy) trained for a few SGD steps must
// end with the parameters of the plain model; a negative control drops
// copy_to_region's backward all-reduce and must miss.
// Tolerance: 1e-5 relative to the largest oracle value, as in layers_test.cpp
// (reordered float32 sums; a few ulps per step, a handful of steps). A wrong
// head assignment or a missing reduction misses by O(1).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "paratrain/core/error.h"
#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/parallel_attention.h"
#include "paratrain/tensor_parallel/parallel_mlp.h"
#include "paratrain/tensor_parallel/random.h"
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
using testing::run_tp;

constexpr double kTolerance = 1e-5;

// Compares every gathered gradient with the plain module's.
double max_grad_diff(const torch::nn::Module& parallel, const torch::nn::Module& plain, const TpContext& ctx) {
  const auto grads = gather_full_parameters(parallel, ctx, Gather::kGradients);
  double worst = 0;
  for (const auto& p : plain.named_parameters()) worst = std::max(worst, rel_diff(grads[p.key()], p.value().grad()));
  return worst;
}

struct Worst {
  std::mutex mu;
  double output = 0, input_grad = 0, weight_grads = 0;
  void add(double o, double i, double w) {
    std::lock_guard<std::mutex> lock(mu);
    output = std::max(output, o);
    input_grad = std::max(input_grad, i);
    weight_grads = std::max(weight_grads, w);
  }
  void check(const char* what, int tp) {
    std::printf("[%s tp=%d] max relative diff: output %.3g, input grad %.3g, weight grads %.3g (tolerance %.0e)\n",
                what, tp, output, input_grad, weight_grads, kTolerance);
    EXPECT_LE(output, kTolerance);
    EXPECT_LE(input_grad, kTolerance);
    EXPECT_LE(weight_grads, kTolerance);
  }
};

class BlocksTest : public ::testing::TestWithParam<int> {};

TEST_P(BlocksTest, ParallelMlpEqualsPlainMlp) {
  const int tp = GetParam();
  torch::manual_seed(20);
  PlainMlp plain(8);
  const at::Tensor x = torch::randn({2, 5, 8});
  const at::Tensor g = torch::randn({2, 5, 8});
  at::Tensor xp = x.clone().requires_grad_(true);
  const at::Tensor y = plain->forward(xp);
  (y * g).sum().backward();
  const auto full = detached(*plain);

  Worst worst;
  run_tp(tp, [&](const TpContext& ctx) {
    auto mlp = ParallelMlpImpl::from_full(full, ParallelMlpOptions{8}, ctx);
    at::Tensor xr = x.clone().requires_grad_(true);
    const at::Tensor yr = mlp->forward(xr);
    (yr * g).sum().backward();
    worst.add(rel_diff(yr.detach(), y.detach()), rel_diff(xr.grad(), xp.grad()), max_grad_diff(*mlp, *plain, ctx));
  });
  worst.check("mlp", tp);
}

TEST_P(BlocksTest, ParallelSelfAttentionEqualsPlainAttention) {
  const int tp = GetParam();
  torch::manual_seed(21);
  PlainAttention plain(16, 4);
  const at::Tensor x = torch::randn({2, 6, 16});
  const at::Tensor g = torch::randn({2, 6, 16});
  at::Tensor xp = x.clone().requires_grad_(true);
  const at::Tensor y = plain->forward(xp);
  (y * g).sum().backward();
  const auto full = detached(*plain);

  Worst worst;
  run_tp(tp, [&](const TpContext& ctx) {
    auto attn = ParallelSelfAttentionImpl::from_full(full, ParallelAttentionOptions{16, 4}, ctx);
    EXPECT_EQ(attn->local_heads(), 4 / tp);
    at::Tensor xr = x.clone().requires_grad_(true);
    const at::Tensor yr = attn->forward(xr);
    (yr * g).sum().backward();
    worst.add(rel_diff(yr.detach(), y.detach()), rel_diff(xr.grad(), xp.grad()), max_grad_diff(*attn, *plain, ctx));
  });
  worst.check("attention", tp);
}

// Built with the constructor from the same seed instead of from_full: the
// initial weights are the plain blocks' too.
TEST_P(BlocksTest, ConstructorsInitializeAsThePlainBlocks) {
  const int tp = GetParam();
  torch::manual_seed(22);
  PlainAttention plain_attn(16, 4);
  PlainMlp plain_mlp(16);
  std::atomic<double> worst{0};
  run_tp(tp, [&](const TpContext& ctx) {
    // Each rank replays the same seed (threads share the global generator,
    // so they take turns).
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    torch::manual_seed(22);
    ParallelSelfAttention attn(ParallelAttentionOptions{16, 4}, ctx);
    ParallelMlp mlp(ParallelMlpOptions{16}, ctx);
    double w = 0;
    for (auto& [parallel, plain] : std::vector<std::pair<torch::nn::Module*, torch::nn::Module*>>{
             {attn.get(), plain_attn.get()}, {mlp.get(), plain_mlp.get()}}) {
      // Shards only (no collective under the lock): compare each with the
      // plain tensor's shard.
      const auto layout = parameter_layout(*parallel);
      for (const auto& p : plain->named_parameters()) {
        const at::Tensor want = shard_of(p.value().detach(), layout[p.key()], ctx.rank(), ctx.size());
        w = std::max(w, rel_diff(parallel->named_parameters()[p.key()].detach(), want));
      }
    }
    double cur = worst.load();
    while (w > cur && !worst.compare_exchange_weak(cur, w)) {
    }
  });
  EXPECT_EQ(worst.load(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Tp, BlocksTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

TEST(BlockErrors, HeadsNotDivisibleNamesBothNumbers) {
  run_tp(4, [](const TpContext& ctx) {
    try {
      ParallelSelfAttention(ParallelAttentionOptions{12, 6}, ctx);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("heads (6)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("(4)"), std::string::npos) << msg;
    }
  });
}

// Attention dropout inside the region draws from each rank's own stream
// (random.h): it is applied in training mode only, and ranks holding
// different heads draw different masks.
TEST(BlockDropout, RegionDropoutIsAppliedFromPerRankStreams) {
  torch::manual_seed(23);
  PlainAttention plain(16, 4);
  const auto full = detached(*plain);
  const at::Tensor x = torch::randn({2, 6, 16});
  const at::Tensor no_dropout = plain->forward(x).detach();
  std::vector<at::Tensor> trained(2), evaluated(2), masks(2);
  run_tp(2, [&](const TpContext& ctx) {
    ParallelAttentionOptions o{16, 4};
    o.attention_dropout = 0.5;
    auto attn = ParallelSelfAttentionImpl::from_full(full, o, ctx);
    attn->train();
    trained[ctx.rank()] = attn->forward(x).detach();
    attn->eval();
    evaluated[ctx.rank()] = attn->forward(x).detach();
    at::Generator gen = make_region_generator(o.seed, ctx.rank());
    masks[ctx.rank()] = dropout_with(torch::ones({64}), 0.5, true, gen);
  });
  EXPECT_GT(rel_diff(trained[0], no_dropout), 1e-2);
  EXPECT_LE(rel_diff(evaluated[0], no_dropout), kTolerance);
  EXPECT_FALSE(torch::equal(masks[0], masks[1]));
}

}  // namespace
}  // namespace paratrain::tensor_parallel

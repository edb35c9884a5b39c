// Tensor-parallel layers against their single-process twins at tp = 2 and 4:
// ColumnParallelLinear and RowParallelLinear vs torch::nn::Linear,
// VocabParallelEmbedding vs torch::nn::Embedding, and the vocabulary-parallel
// cross-entropy vs F::cross_entropy. Each layer is built from the plain
// layer's full weights (from_full); compared: the output, the input gradient
// and the weight/bias gradients gathered back to full tensors.
// Tolerance: 1e-5 relative to the largest oracle value. float32 products are
// summed in a different order (tp partial sums plus an all-reduce instead of
// one dot product), which moves results by a few ulps (~1e-7 relative); 1e-5
// leaves room for that without letting a wrong shard or a missing reduction
// through (those miss by O(1)).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/shards.h"
#include "tests/tensor_parallel/tp_testing.h"

namespace paratrain::tensor_parallel {
namespace {

namespace F = torch::nn::functional;
using testing::rel_diff;
using testing::run_tp;

constexpr double kTolerance = 1e-5;

// Worst relative difference per compared quantity over all ranks, printed so
// the measured margin is visible in the log.
class Diffs {
 public:
  void add(const std::string& what, double d) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(items_.begin(), items_.end(), [&](auto& p) { return p.first == what; });
    if (it == items_.end()) items_.emplace_back(what, d);
    else it->second = std::max(it->second, d);
  }
  void check(const std::string& test) const {
    for (const auto& [what, d] : items_) {
      std::printf("[%s] %s: max relative diff %.3g (tolerance %.0e)\n", test.c_str(), what.c_str(), d, kTolerance);
      EXPECT_LE(d, kTolerance) << what;
    }
    EXPECT_FALSE(items_.empty());
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::string, double>> items_;
};

std::string test_name() { return ::testing::UnitTest::GetInstance()->current_test_info()->name(); }

class LayersTest : public ::testing::TestWithParam<int> {};

// ---- ColumnParallelLinear

void check_column(int tp, bool gather_output) {
  torch::manual_seed(10);
  torch::nn::Linear plain(torch::nn::LinearOptions(6, 8));
  const at::Tensor x = torch::randn({2, 3, 6});
  const at::Tensor g = torch::randn({2, 3, 8});  // upstream gradient
  at::Tensor xp = x.clone().requires_grad_(true);
  const at::Tensor y = plain->forward(xp);
  (y * g).sum().backward();

  Diffs diffs;
  run_tp(tp, [&](const TpContext& ctx) {
    ColumnParallelOptions o;
    o.gather_output = gather_output;
    auto layer = ColumnParallelLinearImpl::from_full(plain->weight.detach(), plain->bias.detach(), o, ctx);
    EXPECT_EQ(layer->weight.size(0), 8 / tp);
    at::Tensor xr = x.clone().requires_grad_(true);
    const at::Tensor yr = layer->forward(xr);
    const int64_t chunk = 8 / tp;
    const at::Tensor y_want = gather_output ? y : y.narrow(-1, ctx.rank() * chunk, chunk);
    const at::Tensor g_mine = gather_output ? g : g.narrow(-1, ctx.rank() * chunk, chunk);
    (yr * g_mine).sum().backward();
    diffs.add("output", rel_diff(yr.detach(), y_want.detach()));
    diffs.add("input grad", rel_diff(xr.grad(), xp.grad()));
    auto grads = gather_full_parameters(*layer, ctx, Gather::kGradients);
    diffs.add("weight grad", rel_diff(grads["weight"], plain->weight.grad()));
    diffs.add("bias grad", rel_diff(grads["bias"], plain->bias.grad()));
    auto values = gather_full_parameters(*layer, ctx);
    diffs.add("gathered weight", rel_diff(values["weight"], plain->weight.detach()));
  });
  diffs.check(test_name());
}

TEST_P(LayersTest, ColumnParallelLinearEqualsLinear) { check_column(GetParam(), false); }
TEST_P(LayersTest, ColumnParallelLinearGatheredEqualsLinear) { check_column(GetParam(), true); }

// ---- RowParallelLinear

void check_row(int tp, bool input_is_parallel) {
  torch::manual_seed(11);
  torch::nn::Linear plain(torch::nn::LinearOptions(8, 5));
  const at::Tensor x = torch::randn({2, 3, 8});
  const at::Tensor g = torch::randn({2, 3, 5});
  at::Tensor xp = x.clone().requires_grad_(true);
  const at::Tensor y = plain->forward(xp);
  (y * g).sum().backward();

  Diffs diffs;
  run_tp(tp, [&](const TpContext& ctx) {
    RowParallelOptions o;
    o.input_is_parallel = input_is_parallel;
    auto layer = RowParallelLinearImpl::from_full(plain->weight.detach(), plain->bias.detach(), o, ctx);
    EXPECT_EQ(layer->weight.size(1), 8 / tp);
    const int64_t chunk = 8 / tp;
    at::Tensor xr = (input_is_parallel ? x.narrow(-1, ctx.rank() * chunk, chunk) : x).clone().requires_grad_(true);
    const at::Tensor yr = layer->forward(xr);
    (yr * g).sum().backward();
    const at::Tensor dx_want = input_is_parallel ? xp.grad().narrow(-1, ctx.rank() * chunk, chunk) : xp.grad();
    diffs.add("output", rel_diff(yr.detach(), y.detach()));
    diffs.add("input grad", rel_diff(xr.grad(), dx_want));
    auto grads = gather_full_parameters(*layer, ctx, Gather::kGradients);
    diffs.add("weight grad", rel_diff(grads["weight"], plain->weight.grad()));
    // The bias is added once after the all-reduce: its gradient is the plain
    // one on every rank (not tp times it).
    diffs.add("bias grad", rel_diff(grads["bias"], plain->bias.grad()));
  });
  diffs.check(test_name());
}

TEST_P(LayersTest, RowParallelLinearEqualsLinear) { check_row(GetParam(), true); }
TEST_P(LayersTest, RowParallelLinearScatteringItsInputEqualsLinear) { check_row(GetParam(), false); }

// ---- VocabParallelEmbedding

TEST_P(LayersTest, VocabParallelEmbeddingEqualsEmbedding) {
  const int tp = GetParam();
  torch::manual_seed(12);
  torch::nn::Embedding plain(torch::nn::EmbeddingOptions(16, 6));
  // Tokens from every rank's range, repeated ones included (gradients add up).
  const at::Tensor tokens = torch::randint(0, 16, {3, 7}, torch::kLong);
  const at::Tensor g = torch::randn({3, 7, 6});
  const at::Tensor y = plain->forward(tokens);
  (y * g).sum().backward();

  Diffs diffs;
  run_tp(tp, [&](const TpContext& ctx) {
    auto emb = VocabParallelEmbeddingImpl::from_full(plain->weight.detach(), ctx);
    EXPECT_EQ(emb->weight.size(0), 16 / tp);
    const at::Tensor yr = emb->forward(tokens);
    (yr * g).sum().backward();
    diffs.add("output", rel_diff(yr.detach(), y.detach()));
    auto grads = gather_full_parameters(*emb, ctx, Gather::kGradients);
    diffs.add("weight grad", rel_diff(grads["weight"], plain->weight.grad()));
  });
  diffs.check(test_name());
}

// ---- vocab_parallel_cross_entropy

TEST_P(LayersTest, VocabParallelCrossEntropyEqualsCrossEntropy) {
  const int tp = GetParam();
  torch::manual_seed(13);
  const int64_t vocab = 32;
  // Large logits: the max subtraction must be the global max, or exp overflows.
  const at::Tensor logits = torch::randn({4, 5, vocab}) * 30;
  const at::Tensor targets = torch::randint(0, vocab, {4, 5}, torch::kLong);
  at::Tensor lp = logits.clone().requires_grad_(true);
  const at::Tensor loss = F::cross_entropy(lp.reshape({-1, vocab}), targets.reshape({-1}));
  loss.backward();
  const at::Tensor per_token =
      F::cross_entropy(logits.reshape({-1, vocab}), targets.reshape({-1}),
                       F::CrossEntropyFuncOptions().reduction(torch::kNone))
          .reshape({4, 5});

  Diffs diffs;
  run_tp(tp, [&](const TpContext& ctx) {
    const int64_t chunk = vocab / tp;
    at::Tensor shard = logits.narrow(-1, ctx.rank() * chunk, chunk).clone().requires_grad_(true);
    const at::Tensor lr = vocab_parallel_cross_entropy(shard, targets, ctx);
    lr.backward();
    diffs.add("mean loss", rel_diff(lr.detach(), loss.detach()));
    diffs.add("logits grad", rel_diff(shard.grad(), lp.grad().narrow(-1, ctx.rank() * chunk, chunk)));
    at::Tensor shard2 = logits.narrow(-1, ctx.rank() * chunk, chunk).clone();
    diffs.add("per-token loss", rel_diff(vocab_parallel_cross_entropy(shard2, targets, ctx, Reduction::kNone),
                                         per_token));
  });
  diffs.check(test_name());
}

INSTANTIATE_TEST_SUITE_P(Tp, LayersTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// ---- layouts and errors

TEST(Shards, StridedLayoutRoundTripsAndNamesItsPieces) {
  // qkv-like: 3 parts of 8 rows over tp = 4: rank 1 holds rows 2-3, 10-11, 18-19.
  const at::Tensor full = torch::arange(24 * 2).reshape({24, 2}).to(torch::kFloat);
  const ShardSpec spec{0, 3, {24, 2}};
  std::vector<at::Tensor> shards;
  for (int r = 0; r < 4; ++r) shards.push_back(shard_of(full, spec, r, 4));
  EXPECT_TRUE(torch::equal(shards[1], torch::cat({full.slice(0, 2, 4), full.slice(0, 10, 12), full.slice(0, 18, 20)})));
  EXPECT_TRUE(torch::equal(unshard(torch::stack(shards), spec), full));
  const auto p = pieces(spec, 1, 4);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1].local_offset, 2);
  EXPECT_EQ(p[1].full_offset, 10);
  EXPECT_EQ(p[1].length, 2);
  // Columns (row-parallel weight).
  const ShardSpec cols{1, 1, {3, 8}};
  const at::Tensor w = torch::randn({3, 8});
  EXPECT_TRUE(torch::equal(shard_of(w, cols, 1, 2), w.slice(1, 4, 8)));
  EXPECT_TRUE(torch::equal(unshard(torch::stack({shard_of(w, cols, 0, 2), shard_of(w, cols, 1, 2)}), cols), w));
}

void expect_error_naming(const std::function<void()>& fn, const std::string& a, const std::string& b) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(a), std::string::npos) << msg;
    EXPECT_NE(msg.find(b), std::string::npos) << msg;
  }
}

TEST(LayerErrors, VocabularyNotDivisibleNamesBothNumbers) {
  run_tp(4, [](const TpContext& ctx) {
    expect_error_naming([&] { VocabParallelEmbedding(VocabParallelEmbeddingOptions{30, 4}, ctx); }, "(30)", "(4)");
  });
}

TEST(LayerErrors, LoadingFromWrongShapeNamesTheParameter) {
  run_tp(2, [](const TpContext& ctx) {
    ColumnParallelLinear layer(ColumnParallelOptions{4, 8}, ctx);
    torch::OrderedDict<std::string, at::Tensor> full;
    full.insert("weight", torch::zeros({8, 5}));
    full.insert("bias", torch::zeros({8}));
    expect_error_naming([&] { load_full_parameters(*layer, full, ctx); }, "'weight'", "[8, 4]");
  });
}

}  // namespace
}  // namespace paratrain::tensor_parallel

// Ring attention on cp = 1, 2, 4 ranks (threads) equals attention over the
// whole sequence computed here with plain ops, softmax(QK^T/sqrt(d) + mask) V,
// forward and the gradients of q, k and v; causal and not. Negative
// controls show the comparison would catch a ring that passes no chunks and
// an online softmax without its rescale step.
//
// Tolerance: 1e-5 of the reference's largest magnitude. The reference runs in
// float64 from the same fp32 inputs, so its own error is negligible; ring
// attention computes in fp32 and sums the softmax and the gradients over
// blocks in another order than one matmul (a few fp32 roundings, ~1e-7
// relative at these sizes, measured values printed by each test).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/sequence_parallel/blockwise_attention.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "tests/support/multi_rank.h"

namespace paratrain::sequence_parallel {
namespace {

constexpr double kTolerance = 1e-5;
constexpr int64_t kBatch = 2, kHeads = 3, kSeq = 16, kHeadDim = 8, kValueDim = 6;

// max |got - want| / max |want|
double relative_diff(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return (got.to(at::kDouble) - w).abs().max().item<double>() / w.abs().max().item<double>();
}

// The oracle: attention over the whole sequence with plain ops in float64.
at::Tensor full_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (causal) {
    const int64_t s = q.size(-2);
    at::Tensor mask = at::full({s, s}, -std::numeric_limits<double>::infinity(), q.options()).triu(1);
    scores = scores + mask;
  }
  return at::matmul(at::softmax(scores, -1), v);
}

struct Problem {
  at::Tensor q, k, v;   // fp32 [B, H, S, *]
  at::Tensor weight;    // loss = sum(out * weight): a gradient that differs per element
  at::Tensor out;       // oracle output (float64)
  at::Tensor dq, dk, dv;  // oracle gradients (float64)
};

Problem make_problem(bool causal, double score_scale = 1.0) {
  torch::manual_seed(7);
  Problem p;
  p.q = torch::randn({kBatch, kHeads, kSeq, kHeadDim}) * score_scale;
  p.k = torch::randn({kBatch, kHeads, kSeq, kHeadDim});
  p.v = torch::randn({kBatch, kHeads, kSeq, kValueDim});
  p.weight = torch::randn({kBatch, kHeads, kSeq, kValueDim});
  at::Tensor q = p.q.to(at::kDouble).requires_grad_(), k = p.k.to(at::kDouble).requires_grad_(),
             v = p.v.to(at::kDouble).requires_grad_();
  at::Tensor out = full_attention(q, k, v, causal);
  (out * p.weight.to(at::kDouble)).sum().backward();
  p.out = out.detach();
  p.dq = q.grad();
  p.dk = k.grad();
  p.dv = v.grad();
  return p;
}

struct RankDiffs {
  double out = 0, dq = 0, dk = 0, dv = 0;
};

// Runs ring attention on cp ranks and returns the largest relative
// difference from the oracle over ranks, for the output and each gradient.
RankDiffs ring_vs_full(int cp, bool causal) {
  const Problem p = make_problem(causal);
  std::mutex mu;
  RankDiffs worst;
  testing::run_ranks(cp, [&](comm::ProcessGroup& group) {
    auto chunk = [&](const at::Tensor& t) { return sequence_chunk(t, 2, group).clone(); };
    at::Tensor q = chunk(p.q).requires_grad_(), k = chunk(p.k).requires_grad_(), v = chunk(p.v).requires_grad_();
    RingAttentionOptions options;
    options.causal = causal;
    at::Tensor out = ring_attention(q, k, v, group, options);
    (out * chunk(p.weight)).sum().backward();
    RankDiffs d{relative_diff(out, chunk(p.out)), relative_diff(q.grad(), chunk(p.dq)),
                relative_diff(k.grad(), chunk(p.dk)), relative_diff(v.grad(), chunk(p.dv))};
    std::lock_guard<std::mutex> lock(mu);
    worst.out = std::max(worst.out, d.out);
    worst.dq = std::max(worst.dq, d.dq);
    worst.dk = std::max(worst.dk, d.dk);
    worst.dv = std::max(worst.dv, d.dv);
  });
  return worst;
}

struct RingCase {
  int cp;
  bool causal;
};

class RingAttentionOracle : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttentionOracle, EqualsFullAttentionForwardAndBackward) {
  const auto [cp, causal] = GetParam();
  const RankDiffs d = ring_vs_full(cp, causal);
  std::printf("cp=%d causal=%d: max relative diff out %.3g, dq %.3g, dk %.3g, dv %.3g (tolerance %.0e)\n", cp,
              causal, d.out, d.dq, d.dk, d.dv, kTolerance);
  EXPECT_LE(d.out, kTolerance);
  EXPECT_LE(d.dq, kTolerance);
  EXPECT_LE(d.dk, kTolerance);
  EXPECT_LE(d.dv, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Cp, RingAttentionOracle,
                         ::testing::Values(RingCase{1, true}, RingCase{2, true}, RingCase{4, true},
                                           RingCase{2, false}, RingCase{4, false}),
                         [](const auto& info) {
                           return "cp" + std::to_string(info.param.cp) +
                                  (info.param.causal ? "_causal" : "_full");
                         });

// Negative control: a "ring" that passes no chunks (each rank attends to its
// own chunk only) is far outside the tolerance, so the oracle test above
// would fail if the chunks did not travel.
TEST(RingAttentionNegativeControl, OwnChunkOnlyDiffers) {
  const Problem p = make_problem(/*causal=*/true);
  const int cp = 4;
  double worst = 0;
  for (int r = 1; r < cp; ++r) {
    at::Tensor q = sequence_chunk(p.q, 2, r, cp), k = sequence_chunk(p.k, 2, r, cp),
               v = sequence_chunk(p.v, 2, r, cp);
    OnlineSoftmax own;
    own.add_block(q, k, v, 1.0 / std::sqrt(double(kHeadDim)), BlockMask::kCausalDiagonal);
    worst = std::max(worst, relative_diff(own.output(), sequence_chunk(p.out, 2, r, cp)));
  }
  std::printf("own chunk only: max relative diff %.3g (tolerance %.0e)\n", worst, kTolerance);
  EXPECT_GT(worst, 100 * kTolerance);
}

// Negative control: the online softmax over the blocks of the last query
// chunk equals the oracle; merging the same blocks without rescaling the
// running sums to the new maximum (each block keeping its own maximum) does
// not. Larger scores make the blocks' maxima differ more, as in training.
TEST(RingAttentionNegativeControl, MergeWithoutRescaleDiffers) {
  const int cp = 4;
  const Problem p = make_problem(/*causal=*/true, /*score_scale=*/3.0);
  const double scale = 1.0 / std::sqrt(double(kHeadDim));
  const int r = cp - 1;
  at::Tensor q = sequence_chunk(p.q, 2, r, cp);
  OnlineSoftmax merged;
  at::Tensor acc_sum, row_sum;  // sum over blocks of each block's own acc and l
  for (int j = 0; j <= r; ++j) {
    at::Tensor k = sequence_chunk(p.k, 2, j, cp), v = sequence_chunk(p.v, 2, j, cp);
    const BlockMask mask = j == r ? BlockMask::kCausalDiagonal : BlockMask::kNone;
    merged.add_block(q, k, v, scale, mask);
    OnlineSoftmax block;
    block.add_block(q, k, v, scale, mask);
    acc_sum = acc_sum.defined() ? acc_sum + block.accumulator() : block.accumulator();
    row_sum = row_sum.defined() ? row_sum + block.row_sum() : block.row_sum();
  }
  const at::Tensor want = sequence_chunk(p.out, 2, r, cp);
  const double with_rescale = relative_diff(merged.output(), want);
  const double without = relative_diff(acc_sum / row_sum.unsqueeze(-1), want);
  std::printf("online softmax: with rescale %.3g, without %.3g (tolerance %.0e)\n", with_rescale, without,
              kTolerance);
  EXPECT_LE(with_rescale, kTolerance);
  EXPECT_GT(without, 100 * kTolerance);
}

TEST(RingAttention, SequenceNotDivisibleByCpIsAClearError) {
  const at::Tensor x = torch::zeros({1, 10, 4});
  try {
    sequence_chunk(x, 1, 0, 4);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("sequence length 10 is not divisible by cp = 4"), std::string::npos) << what;
    EXPECT_NE(what.find("multiple of 4"), std::string::npos) << what;
  }
  EXPECT_THROW(chunk_offset(10, 1, 4), Error);
  EXPECT_NO_THROW(check_sequence_split(12, 4));
  EXPECT_EQ(chunk_offset(12, 3, 4), 9);
  EXPECT_TRUE(torch::equal(sequence_chunk(torch::arange(12), 0, 2, 4), torch::arange(6, 9)));
}

// fp16/bf16 inputs are read as fp32 inside; a bf16 run matches the float64
// oracle to bf16's precision (its inputs and output are rounded to 8 bits).
TEST(RingAttention, Bfloat16InputsComputeInFloat32) {
  const Problem p = make_problem(/*causal=*/true);
  std::mutex mu;
  double worst = 0;
  testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    at::Tensor q = sequence_chunk(p.q, 2, group).to(at::kBFloat16), k = sequence_chunk(p.k, 2, group).to(at::kBFloat16),
               v = sequence_chunk(p.v, 2, group).to(at::kBFloat16);
    at::Tensor out = ring_attention(q, k, v, group);
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, relative_diff(out, sequence_chunk(p.out, 2, group)));
  });
  std::printf("bf16: max relative diff %.3g\n", worst);
  EXPECT_LE(worst, 3e-2);
}

}  // namespace
}  // namespace paratrain::sequence_parallel

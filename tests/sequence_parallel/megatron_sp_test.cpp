// Megatron-SP mappings on tp = 2 and 4 ranks (threads): each mapping's
// forward and backward equal the dense computation it stands for, with the
// sequence as dim 1 ([B, S, d]) and as dim 0 ([S, B, d]); and a LayerNorm ->
// column-parallel linear -> GELU -> row-parallel linear -> residual region run
// sequence-parallel equals the dense region (outputs and every gradient).
//
// Tolerance: 1e-5 of the reference's largest magnitude, float32 both sides.
// The mappings move data exactly; only the sums (reduce-scatter over ranks,
// the split matmuls of the parallel linears, LayerNorm gradients summed over
// chunks) run in another order than the dense ops.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <mutex>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/sequence_parallel/megatron_sp.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "tests/support/multi_rank.h"

namespace paratrain::sequence_parallel {
namespace {

constexpr double kTolerance = 1e-5;

double relative_diff(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return (got.to(at::kDouble) - w).abs().max().item<double>() / w.abs().max().item<double>();
}

// Tracks the worst difference over ranks and checks.
struct Worst {
  std::mutex mu;
  double value = 0;
  void add(double d) {
    std::lock_guard<std::mutex> lock(mu);
    value = std::max(value, d);
  }
};

struct MappingCase {
  int tp;
  int64_t seq_dim;
};

class MegatronSpMappings : public ::testing::TestWithParam<MappingCase> {};

TEST_P(MegatronSpMappings, EqualDenseForwardAndBackward) {
  const int tp = GetParam().tp;
  const int64_t seq_dim = GetParam().seq_dim;
  const int64_t seq = 8;
  torch::manual_seed(3);
  // [B, S, d] or [S, B, d]
  const std::vector<int64_t> shape = seq_dim == 1 ? std::vector<int64_t>{2, seq, 5} : std::vector<int64_t>{seq, 2, 5};
  const at::Tensor x = torch::randn(shape);
  const at::Tensor w = torch::randn(shape);  // loss weights: sum(y * w)
  std::vector<at::Tensor> per_rank_x, per_rank_w;  // a different full-size tensor per rank
  for (int r = 0; r < tp; ++r) {
    per_rank_x.push_back(torch::randn(shape));
    per_rank_w.push_back(torch::randn(shape));
  }
  const at::Tensor sum_x = at::stack(per_rank_x).sum(0), sum_w = at::stack(per_rank_w).sum(0);

  Worst worst;
  testing::run_ranks(tp, [&](comm::ProcessGroup& group) {
    const SequenceParallelContext sp{.group = &group, .seq_dim = seq_dim};
    const int r = group.rank();
    auto chunk = [&](const at::Tensor& t) { return sequence_chunk(t, seq_dim, group).contiguous(); };

    // scatter: forward keeps the chunk; the dense equivalent is the identity
    // on the whole sequence, so x's gradient is all of w.
    {
      at::Tensor xr = x.clone().requires_grad_();
      at::Tensor y = scatter_to_sequence_region(xr, sp);
      worst.add(relative_diff(y, chunk(x)));
      (y * chunk(w)).sum().backward();
      worst.add(relative_diff(xr.grad(), w));
    }
    // gather: forward rebuilds the whole sequence; each rank's use of it
    // (weights w_r) contributes to every chunk's gradient, so chunk r's
    // gradient is chunk r of sum_r w_r.
    {
      at::Tensor xr = chunk(x).requires_grad_();
      at::Tensor y = gather_from_sequence_region(xr, sp);
      worst.add(relative_diff(y, x));
      (y * per_rank_w[r]).sum().backward();
      worst.add(relative_diff(xr.grad(), chunk(sum_w)));
    }
    // reduce-scatter: forward is chunk r of sum_r x_r; every x_r's gradient
    // is all of w.
    {
      at::Tensor xr = per_rank_x[r].clone().requires_grad_();
      at::Tensor y = reduce_scatter_to_sequence_region(xr, sp);
      worst.add(relative_diff(y, chunk(sum_x)));
      (y * chunk(w)).sum().backward();
      worst.add(relative_diff(xr.grad(), w));
    }
  });
  std::printf("tp=%d seq_dim=%ld: max relative diff %.3g (tolerance %.0e)\n", tp, static_cast<long>(seq_dim),
              worst.value, kTolerance);
  EXPECT_LE(worst.value, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Tp, MegatronSpMappings,
                         ::testing::Values(MappingCase{2, 1}, MappingCase{4, 1}, MappingCase{2, 0},
                                           MappingCase{4, 0}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "_seqdim" +
                                  std::to_string(info.param.seq_dim);
                         });

// The parameters of y = x + W2 gelu(W1 LayerNorm(x) + b1) + b2.
struct Region {
  at::Tensor ln_w, ln_b, w1, b1, w2, b2;
};

Region make_region(int64_t d, int64_t hidden) {
  torch::manual_seed(11);
  return {torch::ones({d}) + 0.1 * torch::randn({d}), 0.1 * torch::randn({d}), torch::randn({hidden, d}) * 0.3,
          torch::randn({hidden}) * 0.1, torch::randn({d, hidden}) * 0.3, torch::randn({d}) * 0.1};
}

struct RegionGrads {
  at::Tensor y, dx, ln_w, ln_b, w1, b1, w2, b2;
};

// The dense region on the whole sequence (the oracle).
RegionGrads dense_region(const Region& p, const at::Tensor& x, const at::Tensor& loss_w) {
  auto leaf = [](const at::Tensor& t) { return t.clone().requires_grad_(); };
  at::Tensor xx = leaf(x), ln_w = leaf(p.ln_w), ln_b = leaf(p.ln_b), w1 = leaf(p.w1), b1 = leaf(p.b1),
             w2 = leaf(p.w2), b2 = leaf(p.b2);
  at::Tensor h = at::layer_norm(xx, {x.size(-1)}, ln_w, ln_b);
  at::Tensor y = xx + at::linear(at::gelu(at::linear(h, w1, b1)), w2, b2);
  (y * loss_w).sum().backward();
  return {y.detach(), xx.grad(), ln_w.grad(), ln_b.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()};
}

// Runs the region sequence-parallel on tp ranks: LayerNorm, residual and
// the output bias on sequence chunks, W1 split by output rows (column
// parallel), W2 by input columns (row parallel). `sync` = false leaves out
// the gradient sum of the chunk-local parameters (the negative control).
double sp_region_vs_dense(int tp, bool sync, bool check_chunked_params_only = false) {
  const int64_t batch = 2, seq = 8, d = 6, hidden = 8;
  const Region p = make_region(d, hidden);
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({batch, seq, d});
  const at::Tensor loss_w = torch::randn({batch, seq, d});
  const RegionGrads want = dense_region(p, x, loss_w);

  Worst worst;
  testing::run_ranks(tp, [&](comm::ProcessGroup& group) {
    const SequenceParallelContext sp{.group = &group, .seq_dim = 1};
    const int64_t rows = hidden / tp, r = group.rank();
    auto leaf = [](const at::Tensor& t) { return t.clone().requires_grad_(); };
    auto seq_chunk = [&](const at::Tensor& t) { return sequence_chunk(t, 1, group).contiguous(); };
    at::Tensor xr = leaf(seq_chunk(x)), ln_w = leaf(p.ln_w), ln_b = leaf(p.ln_b), b2 = leaf(p.b2);
    at::Tensor w1 = leaf(p.w1.narrow(0, r * rows, rows)), b1 = leaf(p.b1.narrow(0, r * rows, rows));
    at::Tensor w2 = leaf(p.w2.narrow(1, r * rows, rows));

    at::Tensor h = at::layer_norm(xr, {d}, ln_w, ln_b);                        // [B, S/tp, d]
    at::Tensor full = gather_from_sequence_region(h, sp);                       // [B, S, d]
    at::Tensor partial = at::linear(at::gelu(at::linear(full, w1, b1)), w2);    // [B, S, d], partial sum
    at::Tensor y = xr + reduce_scatter_to_sequence_region(partial, sp) + b2;    // [B, S/tp, d]
    (y * seq_chunk(loss_w)).sum().backward();
    if (sync) sync_sequence_parallel_grads({ln_w, ln_b, b2}, sp);

    worst.add(relative_diff(ln_w.grad(), want.ln_w));
    worst.add(relative_diff(ln_b.grad(), want.ln_b));
    worst.add(relative_diff(b2.grad(), want.b2));
    if (check_chunked_params_only) return;
    worst.add(relative_diff(y, seq_chunk(want.y)));
    worst.add(relative_diff(xr.grad(), seq_chunk(want.dx)));
    worst.add(relative_diff(w1.grad(), want.w1.narrow(0, r * rows, rows)));
    worst.add(relative_diff(b1.grad(), want.b1.narrow(0, r * rows, rows)));
    worst.add(relative_diff(w2.grad(), want.w2.narrow(1, r * rows, rows)));
  });
  return worst.value;
}

TEST(MegatronSpRegion, LayerNormAndParallelLinearsEqualDense) {
  for (int tp : {2, 4}) {
    const double diff = sp_region_vs_dense(tp, /*sync=*/true);
    std::printf("LayerNorm + column/row linear region, tp=%d: max relative diff %.3g (tolerance %.0e)\n", tp, diff,
                kTolerance);
    EXPECT_LE(diff, kTolerance) << "tp=" << tp;
  }
}

// Negative control: without summing the replicated parameters' gradients
// over the sequence chunks, LayerNorm's and the output bias's gradients are
// each rank's share only, far from the dense ones.
TEST(MegatronSpRegion, WithoutGradientSyncDiffers) {
  const double diff = sp_region_vs_dense(2, /*sync=*/false, /*check_chunked_params_only=*/true);
  std::printf("without sync_sequence_parallel_grads: max relative diff %.3g\n", diff);
  EXPECT_GT(diff, 100 * kTolerance);
}

TEST(MegatronSpRegion, SequenceNotDivisibleByTpIsAClearError) {
  EXPECT_THROW(
      {
        try {
          testing::run_ranks(2, [](comm::ProcessGroup& group) {
            const SequenceParallelContext sp{.group = &group};
            scatter_to_sequence_region(torch::zeros({1, 7, 3}), sp);
          });
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("sequence length 7 is not divisible by tp = 2"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace paratrain::sequence_parallel

// The four Megatron mappings, forward and backward, at 1, 2 and 4 ranks,
// against what they mean written out on the full tensors in one process.
// Each rank's upstream gradient differs (rank-specific weights), so a mapping
// whose backward skipped or misplaced its collective would fail. Tolerance:
// 1e-6 relative; the only arithmetic is a sum of tp float32 terms.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/tensor_parallel/mappings.h"
#include "tests/tensor_parallel/tp_testing.h"

namespace paratrain::tensor_parallel {
namespace {

using testing::rel_diff;
using testing::run_tp;

constexpr double kTolerance = 1e-6;

class MappingsTest : public ::testing::TestWithParam<int> {};

// Per-rank tensors made in the main thread (the global generator is not for
// concurrent use); ranks only read them.
std::vector<at::Tensor> per_rank(int tp, std::vector<int64_t> shape) {
  std::vector<at::Tensor> out;
  for (int r = 0; r < tp; ++r) out.push_back(torch::randn(shape));
  return out;
}

TEST_P(MappingsTest, CopyToRegionIsIdentityForwardAndAllReduceBackward) {
  const int tp = GetParam();
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({3, 8});
  const auto w = per_rank(tp, {3, 8});
  const at::Tensor want_grad = at::stack(w).sum(0);
  std::vector<double> fwd(tp), bwd(tp);
  run_tp(tp, [&](const TpContext& ctx) {
    at::Tensor xr = x.clone().requires_grad_(true);
    at::Tensor y = copy_to_region(xr, ctx);
    (y * w[ctx.rank()]).sum().backward();
    fwd[ctx.rank()] = rel_diff(y.detach(), x);
    bwd[ctx.rank()] = rel_diff(xr.grad(), want_grad);
  });
  for (int r = 0; r < tp; ++r) {
    EXPECT_LE(fwd[r], kTolerance) << "rank " << r;
    EXPECT_LE(bwd[r], kTolerance) << "rank " << r;
  }
}

TEST_P(MappingsTest, ReduceFromRegionIsAllReduceForwardAndIdentityBackward) {
  const int tp = GetParam();
  torch::manual_seed(2);
  const auto x = per_rank(tp, {3, 8});
  const at::Tensor g = torch::randn({3, 8});
  const at::Tensor want = at::stack(x).sum(0);
  std::vector<double> fwd(tp), bwd(tp);
  run_tp(tp, [&](const TpContext& ctx) {
    at::Tensor xr = x[ctx.rank()].clone().requires_grad_(true);
    at::Tensor y = reduce_from_region(xr, ctx);
    (y * g).sum().backward();
    fwd[ctx.rank()] = rel_diff(y.detach(), want);
    bwd[ctx.rank()] = rel_diff(xr.grad(), g);
  });
  for (int r = 0; r < tp; ++r) {
    EXPECT_LE(fwd[r], kTolerance) << "rank " << r;
    EXPECT_LE(bwd[r], kTolerance) << "rank " << r;
  }
}

TEST_P(MappingsTest, ScatterKeepsOwnChunkAndGathersGradients) {
  const int tp = GetParam();
  torch::manual_seed(3);
  const int64_t chunk = 3;
  const at::Tensor x = torch::randn({2, 4, chunk * tp});
  const auto w = per_rank(tp, {2, 4, chunk});
  const at::Tensor want_grad = at::cat(w, -1);
  std::vector<double> fwd(tp), bwd(tp);
  run_tp(tp, [&](const TpContext& ctx) {
    const int r = ctx.rank();
    at::Tensor xr = x.clone().requires_grad_(true);
    at::Tensor y = scatter_to_region(xr, ctx);
    (y * w[r]).sum().backward();
    fwd[r] = rel_diff(y.detach(), x.narrow(-1, r * chunk, chunk));
    bwd[r] = rel_diff(xr.grad(), want_grad);
  });
  for (int r = 0; r < tp; ++r) {
    EXPECT_LE(fwd[r], kTolerance) << "rank " << r;
    EXPECT_LE(bwd[r], kTolerance) << "rank " << r;
  }
}

TEST_P(MappingsTest, GatherConcatenatesChunksAndSplitsGradients) {
  const int tp = GetParam();
  torch::manual_seed(4);
  const int64_t chunk = 3;
  const auto x = per_rank(tp, {2, 4, chunk});
  const at::Tensor w = torch::randn({2, 4, chunk * tp});
  const at::Tensor want = at::cat(x, -1);
  std::vector<double> fwd(tp), bwd(tp);
  run_tp(tp, [&](const TpContext& ctx) {
    const int r = ctx.rank();
    at::Tensor xr = x[r].clone().requires_grad_(true);
    at::Tensor y = gather_from_region(xr, ctx);
    (y * w).sum().backward();
    fwd[r] = rel_diff(y.detach(), want);
    bwd[r] = rel_diff(xr.grad(), w.narrow(-1, r * chunk, chunk));
  });
  for (int r = 0; r < tp; ++r) {
    EXPECT_LE(fwd[r], kTolerance) << "rank " << r;
    EXPECT_LE(bwd[r], kTolerance) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, MappingsTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

TEST(Mappings, ScatterOfIndivisibleDimensionNamesBothNumbers) {
  run_tp(2, [](const TpContext& ctx) {
    try {
      scatter_to_region(torch::ones({2, 5}), ctx);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("(5)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("(2)"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace paratrain::tensor_parallel

// Shared helpers of the tensor-parallel tests: run a function on tp ranks as
// threads with a TpContext, and the relative difference used by every oracle
// comparison here.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "paratrain/tensor_parallel/context.h"
#include "tests/support/multi_rank.h"

namespace paratrain::tensor_parallel::testing {

// Largest absolute difference relative to the largest magnitude of the
// oracle: the scale-aware measure for float32 results that differ only by
// the order of summation (a few ulps of the largest term).
inline double rel_diff(const at::Tensor& got, const at::Tensor& want) {
  TORCH_CHECK(got.sizes() == want.sizes(), "shape ", got.sizes(), " vs oracle ", want.sizes());
  const double scale = std::max(want.abs().max().item<double>(), 1e-12);
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() / scale;
}

// Runs fn(ctx) on `tp` threads, each holding rank ctx.rank() of a fresh
// group. A short collective timeout makes a rank that skips a collective fail
// the test rather than hang it.
inline void run_tp(int tp, const std::function<void(const TpContext&)>& fn) {
  paratrain::testing::run_ranks(
      tp, [&](comm::ProcessGroup& group) { fn(TpContext{&group, std::chrono::seconds(30)}); },
      std::chrono::seconds(30));
}

}  // namespace paratrain::tensor_parallel::testing

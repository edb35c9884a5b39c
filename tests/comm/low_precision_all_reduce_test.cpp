// comm::all_reduce_low_precision on 1, 2, 3 and 4 ranks (threads, Gloo over
// TCP). Oracles: the fp32 all-reduce of the same buffers (the result differs
// from it only by the 16-bit roundings, and is not bitwise equal: the wire
// really is 16-bit), sums whose fp32 and 16-bit accumulations differ (the
// accumulation is fp32), and bitwise equality across ranks.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

#include "paratrain/comm/low_precision_all_reduce.h"
#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"

using paratrain::comm::ProcessGroup;
using paratrain::testing::run_ranks;

namespace {

// Rank r's buffer: its own generator (ranks are threads).
at::Tensor values(int rank, int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
  return torch::randn({n}, gen);
}

class LowPrecisionAllReduce : public ::testing::TestWithParam<std::tuple<int, at::ScalarType>> {};

TEST_P(LowPrecisionAllReduce, MatchesTheFp32SumWithin16BitRoundingOnEveryRankAlike) {
  const auto [world, wire] = GetParam();
  // 1001: not divisible by 2, 3 or 4, so the padding of the last slice is exercised.
  const int64_t n = 1001;
  std::mutex m;
  std::vector<at::Tensor> results(world);
  at::Tensor exact;
  run_ranks(world, [&](ProcessGroup& g) {
    auto buf = values(g.rank(), n);
    auto ref = buf.clone();
    g.all_reduce(ref)->wait();
    paratrain::comm::all_reduce_low_precision(g, buf, wire)->wait();
    std::lock_guard lock(m);
    results[g.rank()] = buf;
    if (g.rank() == 0) exact = ref;
  });
  for (int r = 1; r < world; ++r) EXPECT_TRUE(torch::equal(results[r], results[0])) << "rank " << r;
  // Each contribution rounds once to 16 bits, the fp32 sum once more:
  // bf16 keeps 8 significant bits (relative error <= 2^-8 per rounding),
  // fp16 11 (2^-11). Bound by (world + 1) roundings of the largest term.
  const double unit = wire == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double scale = exact.abs().max().item<double>() + world * 4.0;  // |randn| < 4 here
  const double err = (results[0] - exact).abs().max().item<double>();
  EXPECT_LT(err, (world + 1) * unit * scale);
  if (world > 1) EXPECT_FALSE(torch::equal(results[0], exact)) << "no rounding happened: not a 16-bit wire";
}

INSTANTIATE_TEST_SUITE_P(WorldsAndWires, LowPrecisionAllReduce,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(at::kBFloat16, at::kHalf)),
                         [](const auto& info) {
                           return "p" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == at::kBFloat16 ? "_bf16" : "_fp16");
                         });

// 1 + 2^-8 + 2^-8 over three ranks: added left to right in bf16 the first
// 2^-8 is a tie that rounds to even (1) and so is the second, giving 1; in
// fp32 it is 1 + 2^-7, which bf16 holds exactly.
TEST(LowPrecisionAllReduceAccumulation, AddsInFp32) {
  run_ranks(3, [&](ProcessGroup& g) {
    auto buf = torch::full({5}, g.rank() == 0 ? 1.0f : std::ldexp(1.0f, -8));
    auto bf16_left_to_right = (torch::ones({1}, torch::kBFloat16) + std::ldexp(1.0, -8)) + std::ldexp(1.0, -8);
    ASSERT_EQ(bf16_left_to_right.item<float>(), 1.0f);  // the premise
    paratrain::comm::all_reduce_low_precision(g, buf, at::kBFloat16)->wait();
    EXPECT_TRUE(torch::equal(buf, torch::full({5}, 1.0f + std::ldexp(1.0f, -7))));
  });
}

// A bf16 buffer (Debian's Gloo has no bf16 all-reduce) is reduced in place.
TEST(LowPrecisionAllReduceAccumulation, ReducesABf16BufferOverGloo) {
  run_ranks(2, [&](ProcessGroup& g) {
    auto buf = torch::full({7}, static_cast<float>(g.rank() + 1)).to(torch::kBFloat16);
    paratrain::comm::all_reduce_low_precision(g, buf, at::kBFloat16)->wait();
    EXPECT_EQ(buf.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(torch::equal(buf.to(torch::kFloat), torch::full({7}, 3.0f)));
  });
}

TEST(LowPrecisionAllReduceAccumulation, RefusesANon16BitWire) {
  run_ranks(1, [&](ProcessGroup& g) {
    auto buf = torch::ones({3});
    try {
      paratrain::comm::all_reduce_low_precision(g, buf, at::kFloat);
      ADD_FAILURE() << "no error";
    } catch (const paratrain::Error& e) {
      EXPECT_NE(std::string(e.what()).find("bf16 or fp16"), std::string::npos) << e.what();
    }
  });
}

}  // namespace

// The core collectives over every dtype the strategies send (float32,
// float64, bfloat16, int64) and awkward sizes (0, 1, odd, and larger than
// the shm backend's 1 MiB chunk, so chunking and the last partial chunk are
// exercised), against a reference computed in this thread. Runs over
// whichever backend run_ranks picks (Gloo; shm and MPI through
// PARATRAIN_TEST_BACKEND, see tests/CMakeLists.txt).
//
// Values are small integers, so every sum is exact in every dtype (bf16
// holds integers up to 256 exactly) whatever the reduction order, and
// results are compared with equal(); AVG over 2 or 4 ranks divides by a
// power of two, also exact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

#include "tests/support/multi_rank.h"

using paratrain::comm::ProcessGroup;
using paratrain::comm::ReduceOp;
using paratrain::testing::run_ranks;

namespace {

constexpr int64_t kSizes[] = {0, 1, 7, (int64_t{1} << 20) / 4 * 3 + 5};

// Rank r's values: (i % 5) + r + 1, at most 5 + world.
at::Tensor values(int rank, int64_t n, at::ScalarType type) {
  return (torch::arange(n, torch::kLong).remainder(5) + (rank + 1)).to(type);
}

at::Tensor reference(ReduceOp op, int world, int64_t n, at::ScalarType type) {
  at::Tensor acc = values(0, n, torch::kDouble);
  for (int r = 1; r < world; ++r) {
    const at::Tensor v = values(r, n, torch::kDouble);
    acc = op == ReduceOp::kMax ? torch::maximum(acc, v) : op == ReduceOp::kMin ? torch::minimum(acc, v) : acc + v;
  }
  if (op == ReduceOp::kAvg) acc = acc / world;
  return acc.to(type);
}

// Debian's LibTorch 1.13 Gloo takes no bf16 at all ("Invalid scalar
// type"); the strategies send bf16 through the low-precision hooks instead
// (comm/low_precision_all_reduce.h). A hierarchical group's all-reduce
// crosses Gloo among the leaders ("... gloo between" in its backend()).
bool gloo_handles(const ProcessGroup& pg, at::ScalarType type) {
  return !(pg.backend().find("gloo") != std::string::npos && type == torch::kBFloat16);
}

class DtypeCollectivesTest : public ::testing::TestWithParam<std::tuple<int, at::ScalarType>> {};

TEST_P(DtypeCollectivesTest, AllReduceEveryOpAndSize) {
  const auto [world, type] = GetParam();
  run_ranks(world, [&, world = world, type = type](ProcessGroup& pg) {
    if (!gloo_handles(pg, type)) return;
    for (int64_t n : kSizes) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        if (op == ReduceOp::kAvg && !at::isFloatingType(type)) continue;
        auto t = values(pg.rank(), n, type);
        pg.all_reduce(t, op)->wait();
        EXPECT_TRUE(torch::equal(t, reference(op, world, n, type)))
            << to_string(op) << " n=" << n << " " << type << " rank " << pg.rank();
      }
    }
  });
}

TEST_P(DtypeCollectivesTest, ReduceScatterAllGatherBroadcastEverySize) {
  const auto [world, type] = GetParam();
  run_ranks(world, [&, world = world, type = type](ProcessGroup& pg) {
    for (int64_t n : kSizes) {
      // reduce_scatter: n elements per rank out of n * world.
      if (!gloo_handles(pg, type)) return;
      {
        auto in = values(pg.rank(), n * world, type);
        auto out = torch::zeros({n}, type);
        pg.reduce_scatter(out, in, ReduceOp::kSum)->wait();
        EXPECT_TRUE(torch::equal(out, reference(ReduceOp::kSum, world, n * world, type)
                                          .slice(0, pg.rank() * n, (pg.rank() + 1) * n)))
            << "reduce_scatter n=" << n << " " << type << " rank " << pg.rank();
      }

      auto mine = values(pg.rank(), n, type);
      auto gathered = torch::zeros({n * world}, type);
      pg.all_gather(gathered, mine)->wait();
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(torch::equal(gathered.slice(0, r * n, (r + 1) * n), values(r, n, type)))
            << "all_gather n=" << n << " " << type << " slice " << r;

      const int root = world - 1;
      auto b = values(pg.rank(), n, type);
      pg.broadcast(b, root)->wait();
      EXPECT_TRUE(torch::equal(b, values(root, n, type))) << "broadcast n=" << n << " " << type;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DtypeCollectivesTest,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values(torch::kFloat, torch::kDouble, torch::kBFloat16,
                                                              torch::kLong)));

// Many small operations issued before any is waited on: they must complete
// in issue order with the right values (the shm backend queues them on one
// worker; Gloo runs them on its threads).
TEST(DtypeCollectives, ManyOperationsInFlight) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<at::Tensor> ts;
    std::vector<paratrain::comm::WorkHandle> works;
    for (int i = 0; i < 50; ++i) {
      ts.push_back(torch::full({i + 1}, static_cast<float>(i + pg.rank())));
      works.push_back(pg.all_reduce(ts.back()));
    }
    for (int i = 0; i < 50; ++i) {
      works[i]->wait();
      EXPECT_TRUE(torch::equal(ts[i], torch::full({i + 1}, static_cast<float>(2 * i + 1)))) << i;
    }
  });
}

}  // namespace

// all_to_all, reduce, gather, scatter and all_gather_uneven of the Gloo
// backend on 2 and 3 ranks (threads), with uneven splits and element counts
// not divisible by the world size, checked against values built locally.
// Not here: the older collectives (gloo_group_test.cpp), Work semantics and
// abort (work_test.cpp).
#include <numeric>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/support/multi_rank.h"

using paratrain::comm::ProcessGroup;
using paratrain::comm::ReduceOp;
using paratrain::testing::run_ranks;

namespace {

// n values unique to `rank` (100 * rank + 0.5 * i), so a misplaced slice shows.
at::Tensor tagged(int rank, int64_t n) {
  return torch::arange(n, torch::kFloat32) * 0.5f + 100.0f * static_cast<float>(rank);
}

class MoreCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(MoreCollectivesTest, AllToAllEqualSplits) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    // Rows of 3: rank r sends rows [2j, 2j+2) to rank j.
    auto in = tagged(pg.rank(), world * 2 * 3).view({world * 2, 3});
    auto out = torch::zeros({world * 2, 3});
    pg.all_to_all(out, in)->wait();
    for (int src = 0; src < world; ++src) {
      auto expected = tagged(src, world * 2 * 3).view({world * 2, 3}).slice(0, 2 * pg.rank(), 2 * pg.rank() + 2);
      EXPECT_TRUE(torch::equal(out.slice(0, 2 * src, 2 * src + 2), expected)) << "from " << src;
    }
  });
}

TEST_P(MoreCollectivesTest, AllToAllUnevenSplits) {
  const int world = GetParam();
  // Rank s sends rows(s, d) = (s + 2d) % 3 rows to rank d: some zero, all differ.
  auto rows = [](int s, int d) { return static_cast<int64_t>((s + 2 * d) % 3); };
  // Row k of what s sends to d: [s, d, k] as floats.
  auto block = [](int s, int d, int64_t n) {
    auto b = torch::empty({n, 3});
    for (int64_t k = 0; k < n; ++k) {
      b[k][0] = s;
      b[k][1] = d;
      b[k][2] = static_cast<float>(k);
    }
    return b;
  };
  run_ranks(world, [&](ProcessGroup& pg) {
    const int me = pg.rank();
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> send_blocks, expected_blocks;
    for (int d = 0; d < world; ++d) {
      in_splits.push_back(rows(me, d));
      out_splits.push_back(rows(d, me));
      send_blocks.push_back(block(me, d, rows(me, d)));
      expected_blocks.push_back(block(d, me, rows(d, me)));
    }
    auto in = torch::cat(send_blocks);
    auto expected = torch::cat(expected_blocks);
    auto out = torch::full_like(expected, -1.0f);
    pg.all_to_all(out, in, out_splits, in_splits)->wait();
    EXPECT_TRUE(torch::equal(out, expected)) << "rank " << me << "\n" << out << "\nexpected\n" << expected;
  });
}

TEST_P(MoreCollectivesTest, ReduceToEveryRootWithEveryOp) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    const int64_t n = 7;  // not divisible by 2 or 3
    for (int root = 0; root < world; ++root) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        auto t = tagged(pg.rank(), n);
        pg.reduce(t, root, op)->wait();
        if (pg.rank() != root) continue;  // unspecified elsewhere
        auto all = torch::stack([&] {
          std::vector<at::Tensor> v;
          for (int r = 0; r < world; ++r) v.push_back(tagged(r, n));
          return v;
        }());
        auto expected = op == ReduceOp::kSum   ? all.sum(0)
                        : op == ReduceOp::kAvg ? all.mean(0)
                        : op == ReduceOp::kMax ? std::get<0>(all.max(0))
                                               : std::get<0>(all.min(0));
        EXPECT_TRUE(torch::allclose(t, expected)) << to_string(op) << " root " << root;
      }
    }
  });
}

TEST_P(MoreCollectivesTest, GatherToEveryRoot) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    const int64_t n = 5;
    for (int root = 0; root < world; ++root) {
      at::Tensor out;  // left undefined off the root: the API ignores it there
      if (pg.rank() == root) out = torch::zeros({world, n});
      pg.gather(out, tagged(pg.rank(), n), root)->wait();
      if (pg.rank() != root) continue;
      for (int r = 0; r < world; ++r) EXPECT_TRUE(torch::equal(out[r], tagged(r, n))) << "slot " << r;
    }
  });
}

TEST_P(MoreCollectivesTest, ScatterFromEveryRoot) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    const int64_t n = 5;
    for (int root = 0; root < world; ++root) {
      at::Tensor in;  // left undefined off the root
      if (pg.rank() == root) in = tagged(root, world * n);
      auto out = torch::zeros({n});
      pg.scatter(out, in, root)->wait();
      EXPECT_TRUE(torch::equal(out, tagged(root, world * n).slice(0, pg.rank() * n, (pg.rank() + 1) * n)))
          << "root " << root << " rank " << pg.rank();
    }
  });
}

// Shards of a tensor whose numel does not divide by the world size, plus a
// rank with nothing and the all-equal case.
TEST_P(MoreCollectivesTest, AllGatherUnevenConcatenatesInRankOrder) {
  const int world = GetParam();
  std::vector<std::vector<int64_t>> cases = {world == 2 ? std::vector<int64_t>{6, 5} : std::vector<int64_t>{4, 4, 3},
                                             world == 2 ? std::vector<int64_t>{0, 3} : std::vector<int64_t>{2, 0, 5},
                                             std::vector<int64_t>(world, 3),
                                             std::vector<int64_t>(world, 0)};
  run_ranks(world, [&](ProcessGroup& pg) {
    for (const auto& counts : cases) {
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      auto out = torch::full({total}, -1.0f);
      pg.all_gather_uneven(out, tagged(pg.rank(), counts[pg.rank()]), counts)->wait();
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(tagged(r, counts[r]));
      EXPECT_TRUE(torch::equal(out, torch::cat(parts))) << "rank " << pg.rank() << " counts "
                                                        << torch::tensor(counts);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoreCollectivesTest, ::testing::Values(2, 3));

TEST(MoreCollectives, BadArgumentsAreCallerErrors) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto five = torch::zeros({5});
    auto ten = torch::zeros({10});
    EXPECT_THROW(pg.all_to_all(five, five), c10::Error);                 // 5 rows over 2 ranks
    EXPECT_THROW(pg.all_to_all(ten, ten, {5, 5}, {4, 5}), c10::Error);  // splits do not sum to 10
    EXPECT_THROW(pg.all_gather_uneven(ten, five, {5, 4}), c10::Error);  // output != sum(counts)
    EXPECT_THROW(pg.all_gather_uneven(ten, five, {5}), c10::Error);     // one count per rank
    EXPECT_THROW(pg.reduce(five, 2), c10::Error);
    if (pg.rank() == 0) {
      EXPECT_THROW(pg.gather(five, five, 0), c10::Error);  // root's output must hold 2 * 5
    }
  });
}

}  // namespace

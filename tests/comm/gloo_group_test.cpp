// Collectives of the Gloo backend on 1, 2 and 4 ranks (threads), checked
// against values computed locally; sub-groups; timeouts name the operation.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"

using paratrain::comm::ProcessGroup;
using paratrain::comm::ReduceOp;
using paratrain::testing::run_ranks;

namespace {

// Rank r contributes (r + 1) * [1, 2, ..., n], so every reduction has a
// closed form to compare with.
at::Tensor contribution(int rank, int64_t n) {
  return torch::arange(1, n + 1, torch::kFloat32) * static_cast<float>(rank + 1);
}

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, AllReduceSumAvgMaxMin) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    const int64_t n = 1000;
    const float sum_scale = world * (world + 1) / 2.0f;
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      auto t = contribution(pg.rank(), n);
      pg.all_reduce(t, op)->wait();
      float scale = op == ReduceOp::kSum ? sum_scale
                    : op == ReduceOp::kAvg ? sum_scale / world
                    : op == ReduceOp::kMax ? static_cast<float>(world)
                                           : 1.0f;
      auto expected = torch::arange(1, n + 1, torch::kFloat32) * scale;
      EXPECT_TRUE(torch::allclose(t, expected)) << "op " << to_string(op) << " rank " << pg.rank();
    }
  });
}

TEST_P(CollectivesTest, AllGatherPlacesEachRankInItsSlice) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    auto in = contribution(pg.rank(), 7);
    auto out = torch::zeros({world * 7});
    pg.all_gather(out, in)->wait();
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::equal(out.slice(0, r * 7, (r + 1) * 7), contribution(r, 7)));
    }
  });
}

TEST_P(CollectivesTest, ReduceScatterGivesEachRankItsReducedSlice) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    const int64_t chunk = 5;
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      auto in = contribution(pg.rank(), chunk * world);
      auto out = torch::zeros({chunk});
      pg.reduce_scatter(out, in, op)->wait();
      auto full = torch::zeros({chunk * world});
      for (int r = 0; r < world; ++r) {
        auto c = contribution(r, chunk * world);
        full = op == ReduceOp::kMax ? torch::maximum(full, c) : full + c;
      }
      if (op == ReduceOp::kAvg) full /= world;
      auto expected = full.slice(0, pg.rank() * chunk, (pg.rank() + 1) * chunk);
      EXPECT_TRUE(torch::allclose(out, expected)) << to_string(op) << " rank " << pg.rank();
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    for (int root = 0; root < world; ++root) {
      auto t = contribution(pg.rank(), 16);
      pg.broadcast(t, root)->wait();
      EXPECT_TRUE(torch::equal(t, contribution(root, 16)));
    }
    pg.barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(1, 2, 4));

TEST(Collectives, SendRecvRing) {
  run_ranks(3, [](ProcessGroup& pg) {
    const int next = (pg.rank() + 1) % pg.size();
    const int prev = (pg.rank() + pg.size() - 1) % pg.size();
    auto out = contribution(pg.rank(), 8);
    auto in = torch::zeros({8});
    auto s = pg.send(out, next, 3);
    auto r = pg.recv(in, prev, 3);
    s->wait();
    r->wait();
    EXPECT_TRUE(torch::equal(in, contribution(prev, 8)));
  });
}

TEST(Collectives, SubgroupsReduceOnlyAmongMembers) {
  run_ranks(4, [](ProcessGroup& pg) {
    // Two "data-parallel" pairs {0,2} and {1,3}, built in the same order on
    // every rank, as a device mesh would.
    auto even = pg.new_subgroup({0, 2});
    auto odd = pg.new_subgroup({1, 3});
    auto& mine = pg.rank() % 2 == 0 ? even : odd;
    ASSERT_TRUE(mine);
    EXPECT_FALSE(pg.rank() % 2 == 0 ? odd : even);
    EXPECT_EQ(mine->size(), 2);
    EXPECT_EQ(mine->rank(), pg.rank() / 2);
    EXPECT_EQ(mine->global_ranks()[mine->rank()], pg.rank());
    auto t = torch::full({4}, static_cast<float>(pg.rank()));
    mine->all_reduce(t)->wait();
    const float expected = pg.rank() % 2 == 0 ? 0 + 2 : 1 + 3;
    EXPECT_TRUE(torch::equal(t, torch::full({4}, expected)));
  });
}

TEST(Collectives, AMissingPeerIsATimeoutNamingTheOperation) {
  std::atomic<bool> rank0_done{false};
  try {
    run_ranks(
        2,
        [&](ProcessGroup& pg) {
          if (pg.rank() == 1) {
            // Alive but never joins the all-reduce (a stuck peer, not a dead one).
            while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return;
          }
          auto t = torch::ones({4});
          try {
            pg.all_reduce(t)->wait(std::chrono::milliseconds(1500));
          } catch (...) {
            rank0_done = true;
            throw;
          }
          rank0_done = true;
        },
        // Connecting may be slow on a loaded machine; only the wait above is short.
        std::chrono::seconds(30));
    FAIL() << "expected a TimeoutError";
  } catch (const paratrain::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
}

TEST(Collectives, BadArgumentsAreCallerErrors) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto in = torch::ones({3});
    auto out = torch::zeros({5});
    EXPECT_THROW(pg.all_gather(out, in), c10::Error);
    EXPECT_THROW(pg.broadcast(in, 7), c10::Error);
  });
}

}  // namespace

// comm/host_staging_group.h: what the decorator changes, seen on CPU tensors
// (the CPU suites run every collective through it under
// PARATRAIN_TEST_STAGING=1: Staging.CollectiveSuites). A staged operation
// works on a host copy and lands in the caller's tensor at wait(), not when
// the data arrives; an unstaged tensor (what a CPU tensor is in production)
// is the inner group's to fill as before.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "paratrain/comm/host_staging_group.h"
#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"

namespace paratrain::comm {
namespace {

// Rank 1 receives rank 0's tensor into `t` and polls until the inner operation completed,
// then reports what `t` held before and after wait(). run_ranks_on already
// stages its groups with the production options (CPU tensors untouched);
// `stage_cpu` wraps the group once more with CPU tensors staged.
struct Seen {
  float before_wait = 0;
  float after_wait = 0;
};

Seen broadcast(bool stage_cpu) {
  Seen seen;
  testing::run_ranks_on("gloo", 2, [&](ProcessGroup& world) {
    std::shared_ptr<ProcessGroup> held;
    ProcessGroup* g = &world;
    if (stage_cpu) {
      // A sub-group of every rank, wrapped: new_subgroup is collective.
      held = stage_through_host(world.new_subgroup({0, 1}), StagingOptions{.stage_cpu_tensors = true});
      g = held.get();
    }
    // A broadcast, not a recv: Gloo's point-to-point work only notices its
    // completion inside wait(), its collectives on their own threads.
    at::Tensor t = at::full({4}, g->rank() == 0 ? 7.0f : -1.0f);
    auto work = g->broadcast(t, 0);
    while (!work->is_completed()) std::this_thread::yield();
    if (g->rank() == 1) seen.before_wait = t[0].item<float>();
    work->wait();
    if (g->rank() == 1) seen.after_wait = t[0].item<float>();
  });
  return seen;
}

TEST(HostStaging, AStagedBroadcastLandsInTheCallersTensorAtWait) {
  const Seen staged = broadcast(true);
  EXPECT_EQ(staged.before_wait, -1.0f) << "the inner group wrote the caller's tensor: nothing was staged";
  EXPECT_EQ(staged.after_wait, 7.0f);
}

TEST(HostStaging, UnstagedTensorsAreTheInnerGroupsToFill) {
  const Seen direct = broadcast(false);
  EXPECT_EQ(direct.before_wait, 7.0f);
  EXPECT_EQ(direct.after_wait, 7.0f);
}

TEST(HostStaging, TwoWaitersCopyBackOnceAndBothSeeTheResult) {
  testing::run_ranks_on("gloo", 2, [&](ProcessGroup& world) {
    auto g = stage_through_host(world.new_subgroup({0, 1}), StagingOptions{.stage_cpu_tensors = true});
    at::Tensor t = at::full({1000}, static_cast<float>(g->rank() + 1));
    auto work = g->all_reduce(t, ReduceOp::kSum);
    std::thread other([&] { work->wait(); });
    work->wait();
    other.join();
    EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0f)));
  });
}


// With overlap (the default) staged operations start on the group's issuing
// thread; an operation that needs no copy issued while they wait there goes
// behind them, so every rank's inner group sees the same order.
TEST(HostStaging, OperationsKeepTheirOrderThroughTheIssuingThread) {
  testing::run_ranks_on("gloo", 2, [&](ProcessGroup& world) {
    auto g = stage_through_host(world.new_subgroup({0, 1}),
                                StagingOptions{.stage_cpu_tensors = true, .issue_on_thread = true});
    std::vector<at::Tensor> ts;
    std::vector<WorkHandle> works;
    for (int i = 0; i < 20; ++i) {
      ts.push_back(at::full({257}, static_cast<float>(i * (g->rank() + 1))));
      works.push_back(g->all_reduce(ts.back(), ReduceOp::kSum));
      if (i % 5 == 0) works.push_back(g->barrier());
    }
    for (auto& w : works) w->wait();
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(at::equal(ts[i], at::full({257}, 3.0f * i))) << i;
    // A sub-group made behind queued operations: they were issued first.
    at::Tensor last = at::ones({3});
    auto pending = g->all_reduce(last, ReduceOp::kSum);
    auto sub = g->new_subgroup({0, 1});
    pending->wait();
    EXPECT_TRUE(at::equal(last, at::full({3}, 2.0f)));
    at::Tensor s = at::ones({2});
    sub->all_reduce(s, ReduceOp::kSum)->wait();
    EXPECT_TRUE(at::equal(s, at::full({2}, 2.0f)));
  });
}

TEST(HostStaging, WithoutOverlapCopiesAtIssueAndAtWait) {
  testing::run_ranks_on("gloo", 2, [&](ProcessGroup& world) {
    auto g = stage_through_host(world.new_subgroup({0, 1}),
                                StagingOptions{.stage_cpu_tensors = true, .overlap = false});
    at::Tensor t = at::full({100}, static_cast<float>(g->rank() + 1));
    at::Tensor out = at::empty({200});
    g->all_reduce(t, ReduceOp::kMax)->wait();
    g->all_gather(out, t)->wait();
    EXPECT_TRUE(at::equal(t, at::full({100}, 2.0f)));
    EXPECT_TRUE(at::equal(out, at::full({200}, 2.0f)));
  });
}

TEST(HostStaging, AbortFailsTheOperationsStillWaitingToStart) {
  testing::run_ranks_on("gloo", 2, [&](ProcessGroup& world) {
    auto g = stage_through_host(world.new_subgroup({0, 1}),
                                StagingOptions{.stage_cpu_tensors = true, .issue_on_thread = true});
    if (g->rank() == 1) {
      // Rank 0 never joins: rank 1's operations queue or hang in Gloo until abort.
      at::Tensor a = at::ones({4});
      at::Tensor b = at::ones({4});
      auto wa = g->all_reduce(a, ReduceOp::kSum);
      auto wb = g->all_reduce(b, ReduceOp::kSum);
      g->abort();
      EXPECT_THROW(wa->wait(std::chrono::seconds(10)), CommError);
      EXPECT_THROW(wb->wait(std::chrono::seconds(10)), CommError);
      EXPECT_THROW(g->all_reduce(a, ReduceOp::kSum), CommError);
    }
    // Rank 0 keeps its end of the subgroup until rank 1 is done: dropped at
    // once, it could close the connection rank 1 was still finishing (a
    // "Connection closed by peer" in rank 1's connect, seen once under -j2).
    world.barrier()->wait(std::chrono::seconds(60));
  });
}

}  // namespace
}  // namespace paratrain::comm

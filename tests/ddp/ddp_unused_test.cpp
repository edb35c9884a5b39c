// DDP with parameters that get no gradient: an error naming them without
// find_unused_parameters; with it, training equal to single-process oracles
// (parameters unused everywhere, used on one rank only, used only in a
// no_sync() micro-batch); frozen parameters are not reduced at all.
// Tolerance: 1e-5 relative, as in ddp_oracle_test.cpp.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/ddp/training.h"
#include "tests/ddp/two_head_net.h"
#include "tests/support/multi_rank.h"

namespace paratrain::ddp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 99;

TEST(Ddp, UnusedParameterWithoutDetectionIsAnErrorNamingIt) {
  const Problem problem = make_problem(1, 8, /*seed=*/8);
  std::vector<Snapshot> grads(2);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    TwoHeadNet net = make_two_head(kSeed);
    DistributedDataParallel ddp(net.ptr(), group, with_caps(1, 1));
    ddp.prepare_forward();
    try {
      loss_of(net, problem, 0, group.rank(), 2, /*use_extra=*/false).backward();
      ADD_FAILURE() << "backward with unused parameters did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'extra.weight', 'extra.bias'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("find_unused_parameters"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("'head.weight'"), std::string::npos) << msg;
    }
    // The failed step is abandoned; the next one (every parameter used) syncs.
    ddp.prepare_forward();
    net->zero_grad();
    loss_of(net, problem, 0, group.rank(), 2, /*use_extra=*/true).backward();
    Snapshot g;
    for (const auto& item : net->named_parameters()) g.emplace_back(item.key(), item.value().grad().clone());
    grads[group.rank()] = g;
  });
  // Different shards, so equal gradients mean they were averaged.
  EXPECT_TRUE(identical(grads[0], grads[1]));
}

TEST(Ddp, UnusedParameterWithDetectionTrainsLikeSingleProcess) {
  const Problem problem = make_problem(10, 8, /*seed=*/9);
  DdpOptions o = with_caps(256, 1024);
  o.reducer.find_unused_parameters = true;
  auto never = [](int) { return false; };
  const auto ranks = train_two_head(2, o, problem, kSeed, never);
  const Snapshot oracle = two_head_oracle(2, problem, kSeed, never);
  const Snapshot initial = snapshot(*make_two_head(kSeed));
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(max_relative_diff(ranks[r], oracle), kTolerance) << r;
    // Nobody used it: .grad stayed undefined and SGD left it alone.
    for (std::size_t i = 0; i < initial.size(); ++i) {
      if (initial[i].first.rfind("extra.", 0) == 0) {
        EXPECT_TRUE(torch::equal(ranks[r][i].second, initial[i].second));
      }
    }
  }
  // As in one process, .grad of a parameter no rank used stays undefined (a
  // zero gradient would still move it under momentum or weight decay).
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    TwoHeadNet net = make_two_head(kSeed);
    DistributedDataParallel ddp(net.ptr(), group, o);
    ddp.prepare_forward();
    loss_of(net, problem, 0, group.rank(), 2, false).backward();
    EXPECT_FALSE(net->extra->weight.grad().defined());
    EXPECT_TRUE(net->body->weight.grad().defined());
  });
}

// A parameter used in a no_sync() micro-batch but not in the synchronized one
// still contributes what it accumulated (its .grad), not zero. Oracle: one
// process, both micro-batches of both ranks, the first with the extra branch.
TEST(Ddp, NoSyncGradientOfParameterUnusedInTheSyncedMicroBatchIsKept) {
  constexpr int kWorld = 2;
  const Problem problem = make_problem(4, 8, /*seed=*/14);  // per step: 2 micro-batches x 2 ranks x 2 rows
  DdpOptions o = with_caps(256, 1024);
  o.reducer.find_unused_parameters = true;
  // Micro-batch m of rank r: rows of the global batch at [(2m + r) * 2, +2).
  auto micro_loss = [&](TwoHeadNet& net, int step, int m, int r) {
    auto x = problem.batch_inputs(step).narrow(0, (2 * m + r) * 2, 2);
    auto y = problem.batch_targets(step).narrow(0, (2 * m + r) * 2, 2);
    return torch::nn::functional::cross_entropy(net->forward(x, /*use_extra=*/m == 0), y) / 2;
  };
  std::vector<Snapshot> ranks(kWorld);
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    TwoHeadNet net = make_two_head(kSeed + group.rank());
    DistributedDataParallel ddp(net.ptr(), group, o);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < problem.steps; ++step) {
      opt.zero_grad();
      {
        auto guard = ddp.no_sync();
        ddp.prepare_forward();
        micro_loss(net, step, 0, group.rank()).backward();
      }
      ddp.prepare_forward();
      micro_loss(net, step, 1, group.rank()).backward();
      opt.step();
    }
    ranks[group.rank()] = snapshot(*net);
  });
  TwoHeadNet net = make_two_head(kSeed);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < problem.steps; ++step) {
    opt.zero_grad();
    at::Tensor total = torch::zeros({});
    for (int m = 0; m < 2; ++m) {
      for (int r = 0; r < kWorld; ++r) total = total + micro_loss(net, step, m, r);
    }
    (total / kWorld).backward();
    opt.step();
  }
  const Snapshot oracle = snapshot(*net);
  for (int r = 0; r < kWorld; ++r) EXPECT_LE(max_relative_diff(ranks[r], oracle), kTolerance) << r;
}

TEST(Ddp, ParameterUsedOnOneRankIsAveragedWithZeroFromTheOthers) {
  const Problem problem = make_problem(10, 8, /*seed=*/10);
  DdpOptions o = with_caps(256, 1024);  // the extra branch's bucket waits on rank 1
  o.reducer.find_unused_parameters = true;
  auto rank0_only = [](int r) { return r == 0; };
  const auto ranks = train_two_head(2, o, problem, kSeed, rank0_only);
  const Snapshot oracle = two_head_oracle(2, problem, kSeed, rank0_only);
  for (int r = 0; r < 2; ++r) EXPECT_LE(max_relative_diff(ranks[r], oracle), kTolerance) << r;
  // Had rank 1's missing contribution not been counted as zero (e.g. its
  // bucket skipped), ranks would disagree or time out.
  EXPECT_TRUE(identical(ranks[0], ranks[1]));
}

// Frozen parameters: made equal by construction's broadcast (they started
// different), left out of the reducer (no gradient, no error without
// find_unused_parameters), while the trainable ones are averaged. Each check
// has its control: the ranks' frozen weights differed before wrapping, and
// their shards' local gradients differ.
TEST(Ddp, FrozenParametersAreBroadcastButNotReduced) {
  const Problem problem = make_problem(1, 8, /*seed=*/12);
  std::vector<at::Tensor> frozen_before(2), frozen_after(2), body_grad(2), local_body_grad(2);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    TwoHeadNet net = make_two_head(kSeed + rank);
    for (auto& p : net->extra->parameters()) p.set_requires_grad(false);
    frozen_before[rank] = net->extra->weight.detach().clone();
    DistributedDataParallel ddp(net.ptr(), group);  // no find_unused_parameters needed
    frozen_after[rank] = net->extra->weight.detach().clone();
    EXPECT_EQ(ddp.reducer().params().size(), 4u);
    ddp.prepare_forward();
    EXPECT_NO_THROW(loss_of(net, problem, 0, rank, 2, /*use_extra=*/true).backward());
    EXPECT_FALSE(net->extra->weight.grad().defined());
    body_grad[rank] = net->body->weight.grad().clone();
    // The local gradient of the same (broadcast) model on this rank's shard.
    net->zero_grad();
    {
      auto guard = ddp.no_sync();
      ddp.prepare_forward();
      loss_of(net, problem, 0, rank, 2, /*use_extra=*/true).backward();
    }
    local_body_grad[rank] = net->body->weight.grad().clone();
  });
  EXPECT_FALSE(torch::equal(frozen_before[0], frozen_before[1]));
  EXPECT_TRUE(torch::equal(frozen_after[0], frozen_before[0]));
  EXPECT_TRUE(torch::equal(frozen_after[1], frozen_before[0]));
  EXPECT_TRUE(torch::equal(body_grad[0], body_grad[1]));
  EXPECT_FALSE(torch::equal(local_body_grad[0], local_body_grad[1]));
  EXPECT_TRUE(torch::allclose(body_grad[0], (local_body_grad[0] + local_body_grad[1]) / 2, 1e-5, 1e-7));
}

}  // namespace
}  // namespace paratrain::ddp::testing

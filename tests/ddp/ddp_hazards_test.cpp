// DDP hazards that used to fail silently or hang: a model moved or converted
// after wrapping (hooks on stale tensors, so gradients stayed local), a rank
// whose loss reaches no parameter (peers waited for it until the timeout),
// and buffers synchronized on demand (evaluation).
// Tolerance: 1e-5 relative, as in ddp_oracle_test.cpp.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <chrono>
#include <string>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/ddp/training.h"
#include "tests/ddp/two_head_net.h"
#include "tests/support/multi_rank.h"

namespace paratrain::ddp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 77;
// A rank left waiting fails after this instead of the 5-minute default. Not a
// speed bound: a correct run never waits for it.
constexpr std::chrono::milliseconds kHangTimeout{std::chrono::seconds(20)};

double relative_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

void expect_rematerialized_error(const std::string& msg, const std::string& name) {
  EXPECT_NE(msg.find("'" + name + "' was re-materialized after DistributedDataParallel was constructed"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("then construct DistributedDataParallel"), std::string::npos) << msg;
}

// model->to(kDouble) after wrapping: before the check, every rank trained on
// its own gradients with no error (the hooks sat on the float tensors' old
// accumulators). Now prepare_forward() refuses, naming the parameter.
TEST(DdpHazards, ModelConvertedAfterWrappingIsAnError) {
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    DistributedDataParallel ddp(model, group);
    model->to(torch::kDouble);
    try {
      ddp.prepare_forward();
      ADD_FAILURE() << "prepare_forward() accepted a model converted after wrapping";
    } catch (const Error& e) {
      expect_rematerialized_error(e.what(), "fc0.weight");
      EXPECT_NE(std::string(e.what()).find("dtype changed from Float to Double"), std::string::npos) << e.what();
    }
  });
  // The same through set_data() on a single parameter.
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    DistributedDataParallel ddp(model, group);
    auto p = model->named_parameters()["fc1.bias"];
    p.set_data(p.detach().to(torch::kDouble));
    try {
      ddp.prepare_forward();
      ADD_FAILURE() << "prepare_forward() accepted a parameter replaced after wrapping";
    } catch (const Error& e) {
      expect_rematerialized_error(e.what(), "fc1.bias");
    }
  });
}

// The model converted between prepare_forward() and backward: no hook fires,
// so no step opens; finish_backward() notices instead of joining (which
// would hide the mistake behind zero contributions).
TEST(DdpHazards, ModelConvertedAfterPrepareForwardIsCaughtAfterBackward) {
  const Problem problem = make_problem(1, 8, /*seed=*/41);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    DistributedDataParallel ddp(model, group);
    ddp.prepare_forward();
    model->to(torch::kDouble);
    auto x = shard(problem.batch_inputs(0), group.rank(), 2).to(torch::kDouble);
    auto y = shard(problem.batch_targets(0), group.rank(), 2);
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();  // local gradients only
    try {
      ddp.finish_backward();
      ADD_FAILURE() << "finish_backward() accepted a backward that synchronized nothing";
    } catch (const Error& e) {
      expect_rematerialized_error(e.what(), "fc0.weight");
    }
  });
}

// The fix the error message asks for works: convert first, then wrap.
TEST(DdpHazards, ModelConvertedBeforeWrappingSynchronizes) {
  const Problem problem = make_problem(1, 8, /*seed=*/42);
  std::vector<at::Tensor> grads(2);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    model->to(torch::kDouble);
    DistributedDataParallel ddp(model, group);
    ddp.prepare_forward();
    auto x = shard(problem.batch_inputs(0), group.rank(), 2).to(torch::kDouble);
    auto y = shard(problem.batch_targets(0), group.rank(), 2);
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    ddp.finish_backward();
    grads[group.rank()] = model->parameters().front().grad().clone();
  });
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));  // different shards: equal only if averaged
}

// Rank 1's loss reaches no parameter (detached), rank 0's is normal. Rank 1
// joins in finish_backward(): nobody hangs, and both ranks end with rank 0's
// gradient averaged with zero from rank 1, i.e. half of it. With and without
// find_unused_parameters: a rank that contributes nothing is not an error.
// Before finish_backward() existed, rank 0 waited in backward until the
// timeout and rank 1 stepped on its stale gradients.
TEST(DdpHazards, RankWhoseLossReachesNoParameterJoinsTheReduction) {
  const Problem problem = make_problem(2, 8, /*seed=*/43);
  for (bool find_unused : {false, true}) {
    SCOPED_TRACE(find_unused ? "find_unused_parameters" : "default");
    // Oracle: rank 0's shard alone, halved (the mean over two ranks of its
    // gradient and zero).
    std::vector<at::Tensor> want;
    {
      auto model = make_model(ModelKind::kMlp, kSeed);
      auto x = shard(problem.batch_inputs(0), 0, 2);
      auto y = shard(problem.batch_targets(0), 0, 2);
      (torch::nn::functional::cross_entropy(model->forward(x), y) / 2).backward();
      for (const auto& p : model->parameters()) want.push_back(p.grad().clone());
    }
    // And the second, normal step on both ranks: the full-batch gradient.
    std::vector<at::Tensor> want_full;
    {
      auto model = make_model(ModelKind::kMlp, kSeed);
      torch::nn::functional::cross_entropy(model->forward(problem.batch_inputs(1)), problem.batch_targets(1))
          .backward();
      for (const auto& p : model->parameters()) want_full.push_back(p.grad().clone());
    }
    DdpOptions o = with_caps(1024, 4096);
    o.reducer.find_unused_parameters = find_unused;
    o.reducer.timeout = kHangTimeout;
    paratrain::testing::run_ranks(
        2,
        [&](comm::ProcessGroup& group) {
          const int rank = group.rank();
          auto model = make_model(ModelKind::kMlp, kSeed);
          DistributedDataParallel ddp(model, group, o);
          ddp.prepare_forward();
          model->zero_grad();
          auto out = model->forward(shard(problem.batch_inputs(0), rank, 2));
          auto loss = torch::nn::functional::cross_entropy(out, shard(problem.batch_targets(0), rank, 2));
          if (rank == 1) loss = loss.detach().requires_grad_();
          loss.backward();
          ddp.finish_backward();
          EXPECT_EQ(ddp.reducer().synced_steps(), 1);
          auto params = model->parameters();
          for (std::size_t i = 0; i < params.size(); ++i) {
            ASSERT_TRUE(params[i].grad().defined()) << "rank " << rank << " param " << i;
            EXPECT_LE(relative_diff(params[i].grad(), want[i]), kTolerance) << "rank " << rank << " param " << i;
          }
          // The join left no step behind: a normal step synchronizes as usual.
          ddp.prepare_forward();
          model->zero_grad();
          torch::nn::functional::cross_entropy(model->forward(shard(problem.batch_inputs(1), rank, 2)),
                                               shard(problem.batch_targets(1), rank, 2))
              .backward();
          ddp.finish_backward();  // a no-op after a synchronized backward
          EXPECT_EQ(ddp.reducer().synced_steps(), 2);
          for (std::size_t i = 0; i < params.size(); ++i) {
            EXPECT_LE(relative_diff(params[i].grad(), want_full[i]), kTolerance) << "rank " << rank << " param " << i;
          }
        },
        kHangTimeout);
  }
}

// finish_backward() does nothing under no_sync() (peers do not communicate
// either) and refuses to run without prepare_forward().
TEST(DdpHazards, FinishBackwardIsQuietUnderNoSyncAndNeedsPrepareForward) {
  paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    Reducer reducer(trainable_parameters(*model), group);
    EXPECT_THROW(reducer.finish_backward(), c10::Error);
    reducer.prepare_forward();
    reducer.set_sync_enabled(false);
    reducer.finish_backward();
    EXPECT_EQ(reducer.synced_steps(), 0);
  });
}

// World size 1 with the default sink: no hooks, no steps, .grad untouched
// (the local gradient is the average). A sink still sees every bucket (ZeRO-2
// on one rank keeps the whole buffer as its shard).
TEST(DdpHazards, OneRankSkipsTheReducerUnlessASinkIsSet) {
  const Problem problem = make_problem(1, 8, /*seed=*/44);
  paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    auto reference = make_model(ModelKind::kMlp, kSeed);
    DistributedDataParallel ddp(model, group);
    ddp.prepare_forward();
    torch::nn::functional::cross_entropy(model->forward(problem.batch_inputs(0)), problem.batch_targets(0)).backward();
    ddp.finish_backward();
    torch::nn::functional::cross_entropy(reference->forward(problem.batch_inputs(0)), problem.batch_targets(0))
        .backward();
    EXPECT_EQ(ddp.reducer().synced_steps(), 0);
    for (std::size_t i = 0; i < model->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(model->parameters()[i].grad(), reference->parameters()[i].grad())) << i;
    }
    DdpOptions o;
    o.reducer.comm_hook = [](comm::ProcessGroup& g, std::size_t, at::Tensor& t) { return g.all_reduce(t); };
    auto hooked_model = make_model(ModelKind::kMlp, kSeed);
    DistributedDataParallel hooked(hooked_model, group, o);
    hooked.prepare_forward();
    hooked_model->forward(problem.batch_inputs(0)).sum().backward();
    EXPECT_EQ(hooked.reducer().synced_steps(), 1);
  });
}

// sync_buffers() makes buffers equal on demand, for evaluation with
// broadcast_buffers off or outside the training loop.
TEST(DdpHazards, SyncBuffersBroadcastsRankZerosBuffersOnDemand) {
  std::vector<float> before(2), after(2);
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    TwoHeadNet net = make_two_head(kSeed);
    DdpOptions o;
    o.broadcast_buffers = false;
    DistributedDataParallel ddp(net.ptr(), group, o);
    net->stat.fill_(static_cast<float>(group.rank() + 5));
    ddp.prepare_forward();  // broadcast_buffers off: buffers stay as they are
    before[group.rank()] = net->stat.item<float>();
    ddp.sync_buffers();
    after[group.rank()] = net->stat.item<float>();
  });
  EXPECT_NE(before[0], before[1]);  // the control: they differed
  EXPECT_EQ(after[0], 5.0f);
  EXPECT_EQ(after[1], 5.0f);
}

}  // namespace
}  // namespace paratrain::ddp::testing

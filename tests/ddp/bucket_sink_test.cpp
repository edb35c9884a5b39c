// The reducer with a bucket sink (bucket_sink.h) and explicit bucket plans:
// the calls a sink sees and the buffers it gets, a reduce-scatter sink that
// keeps only this rank's shard (ZeRO-2's use), explicit plans, and the
// options' validation.
// Tolerance: 1e-5 relative (max |a - b| / max |b|), as in ddp_oracle_test.cpp:
// the reducer's float32 sums and the oracle's differ only in order.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>
#include <vector>

#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/ddp/training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::ddp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 21;

double relative_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  const double diff = (a - b).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

// Gradients (in trainable_parameters order) of the mean cross-entropy of the
// model built from `seed` on `x`, `y`: the single-process oracle's gradients.
std::vector<at::Tensor> oracle_gradients(const at::Tensor& x, const at::Tensor& y) {
  auto model = make_model(ModelKind::kMlp, kSeed);
  torch::nn::functional::cross_entropy(model->forward(x), y).backward();
  std::vector<at::Tensor> out;
  for (const auto& p : trainable_parameters(*model)) out.push_back(p.tensor.grad().clone());
  return out;
}

// What bucket `plan`'s buffer holds for these gradients: packed, zero-padded.
at::Tensor pack(const BucketPlan& plan, const std::vector<at::Tensor>& grads) {
  at::Tensor flat = torch::zeros({plan.padded_numel});
  for (std::size_t k = 0; k < plan.params.size(); ++k) {
    const at::Tensor& g = grads[plan.params[k]];
    flat.narrow(0, plan.offsets[k], g.numel()).copy_(g.reshape({-1}));
  }
  return flat;
}

// Records every call with a copy of the buffer; all-reduces like DDP.
class RecordingSink final : public BucketSink {
 public:
  struct Call {
    std::string what;  // "launch" or "reduced"
    std::size_t index;
    at::Tensor buffer;
  };
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override {
    calls.push_back({"launch", index, buffer.clone()});
    return group.all_reduce(buffer, comm::ReduceOp::kSum);
  }
  void reduced(std::size_t index, at::Tensor& buffer) override {
    calls.push_back({"reduced", index, buffer.clone()});
  }
  std::vector<Call> calls;
};

// ZeRO-2's sink: reduce-scatters each bucket into this rank's shard of it and
// keeps only the shard.
class ReduceScatterSink final : public BucketSink {
 public:
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override {
    if (shards.size() <= index) shards.resize(index + 1);
    shards[index] = torch::zeros({buffer.numel() / group.size()}, buffer.options());
    return group.reduce_scatter(shards[index], buffer, comm::ReduceOp::kSum);
  }
  void reduced(std::size_t index, at::Tensor&) override { reduced_calls.push_back(index); }
  bool writes_back() const override { return false; }
  std::vector<at::Tensor> shards;
  std::vector<std::size_t> reduced_calls;
};

// The sink is called launch 0..n-1 during backward, then reduced 0..n-1 at
// its end; launch gets this rank's gradient divided by the group size,
// reduced the average, which the reducer then writes back into .grad.
TEST(BucketSink, SeesLaunchesThenResultsInIndexOrderWithTheRightBuffers) {
  constexpr int kWorld = 2;
  const Problem problem = make_problem(1, 8, /*seed=*/31);
  const auto x = problem.batch_inputs(0);
  const auto y = problem.batch_targets(0);
  const std::vector<at::Tensor> average = oracle_gradients(x, y);
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    const std::vector<at::Tensor> local = oracle_gradients(shard(x, rank, kWorld), shard(y, rank, kWorld));
    auto model = make_model(ModelKind::kMlp, kSeed);
    auto sink = std::make_shared<RecordingSink>();
    DdpOptions o = with_caps(1024, 4096);
    o.reducer.sink = sink;
    DistributedDataParallel ddp(model, group, o);
    const auto& plans = ddp.reducer().plans();
    ASSERT_GE(plans.size(), 3u);
    ddp.prepare_forward();
    torch::nn::functional::cross_entropy(model->forward(shard(x, rank, kWorld)), shard(y, rank, kWorld)).backward();

    const std::size_t n = plans.size();
    ASSERT_EQ(sink->calls.size(), 2 * n);
    for (std::size_t b = 0; b < n; ++b) {
      const auto& launch = sink->calls[b];
      const auto& reduced = sink->calls[n + b];
      EXPECT_EQ(launch.what, "launch");
      EXPECT_EQ(launch.index, b);
      EXPECT_EQ(reduced.what, "reduced");
      EXPECT_EQ(reduced.index, b);
      EXPECT_LE(relative_diff(launch.buffer, pack(plans[b], local) / kWorld), kTolerance) << b;
      EXPECT_LE(relative_diff(reduced.buffer, pack(plans[b], average)), kTolerance) << b;
      // Negative control: this rank's own gradient is not the average.
      EXPECT_GT(relative_diff(pack(plans[b], local), pack(plans[b], average)), 1e-2) << b;
    }
    const auto params = trainable_parameters(*model);
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_LE(relative_diff(params[i].tensor.grad(), average[i]), kTolerance) << params[i].name;
    }
  });
}

// Reduce-scatter into shards on 3 ranks (buckets padded to a multiple of 3):
// rank r's shard of bucket b is slice r of the bucket's averaged buffer, and
// no full-size .grad is left behind.
TEST(BucketSink, ReduceScatterSinkKeepsThisRanksShardOfTheAverage) {
  constexpr int kWorld = 3;
  const Problem problem = make_problem(1, 12, /*seed=*/32);
  const auto x = problem.batch_inputs(0);
  const auto y = problem.batch_targets(0);
  const std::vector<at::Tensor> average = oracle_gradients(x, y);
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    const std::vector<at::Tensor> local = oracle_gradients(shard(x, rank, kWorld), shard(y, rank, kWorld));
    auto model = make_model(ModelKind::kMlp, kSeed);
    auto sink = std::make_shared<ReduceScatterSink>();
    DdpOptions o = with_caps(1024, 4096);
    o.reducer.buckets.pad_to_multiple = kWorld;
    o.reducer.sink = sink;
    DistributedDataParallel ddp(model, group, o);
    const auto& plans = ddp.reducer().plans();
    ASSERT_GE(plans.size(), 3u);
    bool padded = false;
    for (const auto& p : plans) padded = padded || p.padded_numel != p.numel;
    EXPECT_TRUE(padded) << "no bucket needed padding; the test would not exercise it";

    for (int step = 0; step < 2; ++step) {  // the second step starts from undefined .grad
      ddp.prepare_forward();
      torch::nn::functional::cross_entropy(model->forward(shard(x, rank, kWorld)), shard(y, rank, kWorld))
          .backward();
      ASSERT_EQ(sink->shards.size(), plans.size());
      EXPECT_EQ(sink->reduced_calls.size(), (step + 1) * plans.size());
      for (std::size_t b = 0; b < plans.size(); ++b) {
        const int64_t len = plans[b].padded_numel / kWorld;
        const at::Tensor want = pack(plans[b], average).narrow(0, rank * len, len);
        EXPECT_LE(relative_diff(sink->shards[b], want), kTolerance) << "bucket " << b << " step " << step;
        // Negative control: the local (unreduced) slice is far from it.
        EXPECT_GT(relative_diff(pack(plans[b], local).narrow(0, rank * len, len), want), 1e-2) << b;
      }
      for (const auto& p : trainable_parameters(*model)) EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
    }
  });
}

// Records the buffers it was given (weakly, so the record keeps nothing
// alive) and reduce-scatters a copy of each: the backend's worker thread may
// drop its reference to a collective's input a moment after wait() returns,
// so only with a copy does "expired" depend on the reducer alone.
class WatchingSink final : public BucketSink {
 public:
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override {
    launched.push_back(buffer.storage().getWeakStorageImpl());
    if (shards.size() <= index) {
      shards.resize(index + 1);
      sent.resize(index + 1);
    }
    sent[index] = buffer.clone();
    shards[index] = torch::zeros({buffer.numel() / group.size()}, buffer.options());
    return group.reduce_scatter(shards[index], sent[index], comm::ReduceOp::kSum);
  }
  void reduced(std::size_t index, at::Tensor&) override { sent[index] = at::Tensor(); }
  bool writes_back() const override { return false; }
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> launched;
  std::vector<at::Tensor> shards;
  std::vector<at::Tensor> sent;
};

// With a sink that keeps only a shard, bucket buffers are transient: none
// exists between steps (before the first, after each), every buffer a
// collective used is freed by the end of backward, and the shards still
// equal the oracle's average (padding included, 3 ranks). Control:
// persistent_buffers keeps every bucket allocated with the same results.
TEST(BucketSink, NonWriteBackSinkHoldsNoBucketBufferBetweenSteps) {
  constexpr int kWorld = 3;
  const Problem problem = make_problem(1, 12, /*seed=*/34);
  const auto x = problem.batch_inputs(0);
  const auto y = problem.batch_targets(0);
  const std::vector<at::Tensor> average = oracle_gradients(x, y);
  for (bool persistent : {false, true}) {
    paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
      const int rank = group.rank();
      auto model = make_model(ModelKind::kMlp, kSeed);
      auto sink = std::make_shared<WatchingSink>();
      DdpOptions o = with_caps(1024, 4096);
      o.reducer.buckets.pad_to_multiple = kWorld;
      o.reducer.sink = sink;
      o.reducer.persistent_buffers = persistent;
      DistributedDataParallel ddp(model, group, o);
      const auto& plans = ddp.reducer().plans();
      ASSERT_GE(plans.size(), 3u);
      int64_t all_bytes = 0;
      for (const auto& p : plans) all_bytes += p.padded_numel * 4;
      EXPECT_EQ(ddp.reducer().buffer_bytes(), persistent ? all_bytes : 0) << "before the first step";

      for (int step = 0; step < 2; ++step) {
        sink->launched.clear();
        ddp.prepare_forward();
        torch::nn::functional::cross_entropy(model->forward(shard(x, rank, kWorld)), shard(y, rank, kWorld))
            .backward();
        ASSERT_EQ(sink->launched.size(), plans.size());
        EXPECT_EQ(ddp.reducer().buffer_bytes(), persistent ? all_bytes : 0) << "step " << step;
        for (std::size_t b = 0; b < plans.size(); ++b) {
          EXPECT_EQ(sink->launched[b].expired(), !persistent) << "bucket " << b << " step " << step;
          const int64_t len = plans[b].padded_numel / kWorld;
          const at::Tensor want = pack(plans[b], average).narrow(0, rank * len, len);
          EXPECT_LE(relative_diff(sink->shards[b], want), kTolerance) << "bucket " << b << " step " << step;
        }
        for (const auto& p : trainable_parameters(*model)) EXPECT_FALSE(p.tensor.grad().defined()) << p.name;
      }
    });
  }
}

// Explicit plans replace plan_buckets(): registration order (first layer in
// bucket 0, launched first although it is ready last), padding as given.
TEST(BucketSink, ExplicitPlansAreUsedAsGiven) {
  constexpr int kWorld = 2;
  const Problem problem = make_problem(1, 8, /*seed=*/33);
  const auto x = problem.batch_inputs(0);
  const auto y = problem.batch_targets(0);
  const std::vector<at::Tensor> average = oracle_gradients(x, y);
  paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    auto model = make_model(ModelKind::kMlp, kSeed);
    const auto params = trainable_parameters(*model);
    ASSERT_EQ(params.size(), 6u);
    auto bucket = [&](std::vector<std::size_t> which, int64_t padding) {
      BucketPlan plan;
      plan.params = which;
      for (std::size_t p : which) {
        plan.offsets.push_back(plan.numel);
        plan.numel += params[p].tensor.numel();
      }
      plan.padded_numel = plan.numel + padding;
      return plan;
    };
    const std::vector<BucketPlan> given = {bucket({0, 1}, 5), bucket({2, 3, 4, 5}, 0)};
    auto sink = std::make_shared<RecordingSink>();
    DdpOptions o;
    o.reducer.plans = given;
    o.reducer.sink = sink;
    DistributedDataParallel ddp(model, group, o);
    ASSERT_EQ(ddp.reducer().plans().size(), 2u);
    for (std::size_t b = 0; b < 2; ++b) {
      EXPECT_EQ(ddp.reducer().plans()[b].params, given[b].params);
      EXPECT_EQ(ddp.reducer().plans()[b].padded_numel, given[b].padded_numel);
    }
    ddp.prepare_forward();
    torch::nn::functional::cross_entropy(model->forward(shard(x, rank, kWorld)), shard(y, rank, kWorld)).backward();
    ASSERT_EQ(sink->calls.size(), 4u);
    for (std::size_t b = 0; b < 2; ++b) {
      EXPECT_EQ(sink->calls[b].buffer.numel(), given[b].padded_numel);
      EXPECT_LE(relative_diff(sink->calls[2 + b].buffer, pack(given[b], average)), kTolerance);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_LE(relative_diff(params[i].tensor.grad(), average[i]), kTolerance) << params[i].name;
    }
  });
}

std::string construction_error(const ReducerOptions& options) {
  std::string message;
  paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& group) {
    auto model = make_model(ModelKind::kMlp, kSeed);
    try {
      Reducer reducer(trainable_parameters(*model), group, options);
    } catch (const c10::Error& e) {
      message = e.what();
    }
  });
  return message;
}

TEST(BucketSink, BadOptionsAreRejectedWithAClearMessage) {
  auto model = make_model(ModelKind::kMlp, kSeed);
  std::vector<ParamSpec> specs;
  for (const auto& p : trainable_parameters(*model)) specs.push_back({p.tensor.numel(), at::kFloat, at::kCPU});
  const std::vector<BucketPlan> good = plan_buckets(specs, {.bucket_cap_bytes = 4096, .first_bucket_cap_bytes = 1024});
  ASSERT_GE(good.size(), 2u);
  EXPECT_NO_THROW(validate_plans(good, specs));

  auto expect_error = [&](std::vector<BucketPlan> plans, const std::string& needle) {
    ReducerOptions o;
    o.plans = std::move(plans);
    const std::string msg = construction_error(o);
    EXPECT_NE(msg.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << msg;
  };
  {
    auto plans = good;
    plans.pop_back();
    expect_error(plans, "is in no bucket plan");
  }
  {
    auto plans = good;
    plans.push_back(good.front());
    expect_error(plans, "each parameter belongs to exactly one bucket");
  }
  {
    auto plans = good;
    plans[0].offsets.back() += 1;
    expect_error(plans, "packed back to back");
  }
  {
    auto plans = good;
    plans[0].dtype = at::kDouble;
    expect_error(plans, "one dtype on one device");
  }
  {
    auto plans = good;
    plans[0].padded_numel = plans[0].numel - 1;
    expect_error(plans, "< numel");
  }
  ReducerOptions both;
  both.sink = std::make_shared<RecordingSink>();
  both.comm_hook = [](comm::ProcessGroup& g, std::size_t, at::Tensor& t) { return g.all_reduce(t); };
  EXPECT_NE(construction_error(both).find("either `sink` or `comm_hook`"), std::string::npos);
  // .grad cannot view a bucket buffer that is freed after every step.
  ReducerOptions view;
  view.sink = std::make_shared<ReduceScatterSink>();
  view.gradient_as_bucket_view = true;
  EXPECT_NE(construction_error(view).find("released after every step"), std::string::npos);
  view.persistent_buffers = true;
  EXPECT_EQ(construction_error(view), "");
}

}  // namespace
}  // namespace paratrain::ddp::testing

// Two reducer behaviours that only show inside backward: a sink that does not
// write back gets each .grad released as soon as it is in its bucket
// (ReducerOptions::release_gradients_early, no_sync still accumulating), and
// StepStats take a bucket's completion time from Work::completed_at() when
// the backend gives one. Not here: the sinks' results (bucket_sink_test.cpp).
// Tolerance: 1e-5 relative, as in bucket_sink_test.cpp.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/ddp/training.h"
#include "tests/support/forwarding_group.h"
#include "tests/support/multi_rank.h"

namespace paratrain::ddp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 23;

// Reduce-scatters each bucket (keeps this rank's shard) and records, at
// launch, whether any parameter of the bucket still had a .grad.
class ProbeSink final : public BucketSink {
 public:
  explicit ProbeSink(std::vector<at::Tensor> params) : params_(std::move(params)) {}
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override {
    bool any = false;
    for (std::size_t p : plans.at(index).params) any = any || params_[p].grad().defined();
    grad_alive_at_launch.push_back(any);
    if (shards.size() <= index) shards.resize(index + 1);
    shards[index] = torch::zeros({buffer.numel() / group.size()}, buffer.options());
    return group.reduce_scatter(shards[index], buffer, comm::ReduceOp::kSum);
  }
  bool writes_back() const override { return false; }
  std::vector<bool> grad_alive_at_launch;
  std::vector<at::Tensor> shards;
  std::vector<BucketPlan> plans;  // the reducer's, set before the first backward

 private:
  std::vector<at::Tensor> params_;
};

double relative_diff(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / scale;
}

// Release on: when a bucket launches, none of its parameters holds a .grad
// any more (control: release off, every one still does). With no_sync, the
// unsynchronized backward keeps .grad (it must accumulate), and the next
// synchronized one reduces the sum: the shards equal twice those of one
// backward on the same batch, with release on and off alike.
TEST(ReducerRelease, GradientsFreedAtCopyButAccumulatedUnderNoSync) {
  constexpr int kWorld = 2;
  const Problem problem = make_problem(1, 8, /*seed=*/41);
  for (bool release : {true, false}) {
    paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
      const int rank = group.rank();
      const auto x = shard(problem.batch_inputs(0), rank, kWorld);
      const auto y = shard(problem.batch_targets(0), rank, kWorld);
      auto model = make_model(ModelKind::kMlp, kSeed);
      std::vector<at::Tensor> params;
      for (const auto& p : trainable_parameters(*model)) params.push_back(p.tensor);
      DdpOptions o = with_caps(1024, 4096);
      o.reducer.buckets.pad_to_multiple = kWorld;
      o.reducer.release_gradients_early = release;
      auto sink = std::make_shared<ProbeSink>(params);
      o.reducer.sink = sink;
      DistributedDataParallel ddp(model, group, o);
      sink->plans = ddp.reducer().plans();
      const std::vector<BucketPlan>& plans = sink->plans;
      ASSERT_GE(plans.size(), 3u);
      auto backward = [&] {
        ddp.prepare_forward();
        torch::nn::functional::cross_entropy(model->forward(x), y).backward();
        ddp.finish_backward();
      };

      backward();
      ASSERT_EQ(sink->grad_alive_at_launch.size(), plans.size());
      for (std::size_t b = 0; b < plans.size(); ++b) {
        EXPECT_EQ(sink->grad_alive_at_launch[b], !release) << "bucket " << b << " release " << release;
      }
      std::vector<at::Tensor> once;
      for (const at::Tensor& s : sink->shards) once.push_back(s.clone());
      for (const at::Tensor& p : params) EXPECT_FALSE(p.grad().defined());

      {
        auto guard = ddp.no_sync();
        backward();
      }
      for (const at::Tensor& p : params) EXPECT_TRUE(p.grad().defined()) << "no_sync must keep .grad";
      EXPECT_EQ(sink->grad_alive_at_launch.size(), plans.size()) << "no_sync launched a bucket";
      backward();
      for (std::size_t b = 0; b < plans.size(); ++b) {
        EXPECT_LE(relative_diff(sink->shards[b], 2 * once[b]), kTolerance) << "bucket " << b;
      }
      for (const at::Tensor& p : params) EXPECT_FALSE(p.grad().defined());
    });
  }
}

// A Work whose backend "stamped" completion at a chosen offset from when the
// collective was issued; everything else forwards to the real work.
class StampedWork final : public comm::Work {
 public:
  StampedWork(comm::WorkHandle inner, std::optional<Clock::duration> after)
      : inner_(std::move(inner)), issued_(Clock::now()), after_(after) {}
  using comm::Work::wait;
  void wait(std::chrono::milliseconds timeout) override { inner_->wait(timeout); }
  bool is_completed() override { return inner_->is_completed(); }
  std::optional<Clock::time_point> completed_at() override {
    if (!after_) return std::nullopt;
    return issued_ + *after_;
  }

 private:
  comm::WorkHandle inner_;
  Clock::time_point issued_;
  std::optional<Clock::duration> after_;
};

class StampingGroup final : public paratrain::testing::ForwardingGroup {
 public:
  StampingGroup(comm::ProcessGroup& inner, std::optional<comm::Work::Clock::duration> after)
      : ForwardingGroup(inner), after_(after) {}
  comm::WorkHandle all_reduce(at::Tensor& t, comm::ReduceOp op) override {
    return std::make_shared<StampedWork>(inner().all_reduce(t, op), after_);
  }

 private:
  std::optional<comm::Work::Clock::duration> after_;
};

StepStats one_step(comm::ProcessGroup& group) {
  const Problem problem = make_problem(1, 8, /*seed=*/43);
  auto model = make_model(ModelKind::kMlp, kSeed);
  DistributedDataParallel ddp(model, group, with_caps(1, 1));
  ddp.prepare_forward();
  torch::nn::functional::cross_entropy(model->forward(shard(problem.batch_inputs(0), group.rank(), 2)),
                                       shard(problem.batch_targets(0), group.rank(), 2))
      .backward();
  return ddp.last_step_stats();
}

// completed_ms comes from the backend's stamp. Stamped an hour after issue
// (far past anything the reducer could observe by polling: control below),
// every bucket completes >= launch + 1 h, and hidden_share() is the share of
// the union [first launch, last completion] that lies before backward ended.
// Stamped at issue, every bucket completes before backward ends (hidden_share
// exactly 1), however late the reducer polled it.
TEST(ReducerStats, CompletionTimesComeFromTheBackendStamp) {
  using std::chrono::hours;
  constexpr double kHourMs = 3600.0 * 1000.0;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& real) {
    StampingGroup late(real, hours(1));
    const StepStats s = one_step(late);
    ASSERT_EQ(s.buckets.size(), 6u);
    double first_launch = s.buckets[0].launched_ms;
    double last_completion = 0;
    for (std::size_t b = 0; b < s.buckets.size(); ++b) {
      const BucketTiming& t = s.buckets[b];
      ASSERT_GE(t.launched_ms, 0) << b;
      EXPECT_GE(t.completed_ms, t.launched_ms + kHourMs) << b;
      EXPECT_LE(t.launched_ms, s.backward_ms) << b;
      first_launch = std::min(first_launch, t.launched_ms);
      last_completion = std::max(last_completion, t.completed_ms);
    }
    const double want = (s.backward_ms - first_launch) / (last_completion - first_launch);
    EXPECT_NEAR(s.hidden_share(), want, 1e-12);
    EXPECT_LT(s.hidden_share(), 1e-3);

    StampingGroup at_issue(real, comm::Work::Clock::duration::zero());
    const StepStats e = one_step(at_issue);
    ASSERT_EQ(e.buckets.size(), 6u);
    for (std::size_t b = 0; b < e.buckets.size(); ++b) {
      EXPECT_GE(e.buckets[b].completed_ms, e.buckets[b].launched_ms) << b;
      EXPECT_LE(e.buckets[b].completed_ms, e.backward_ms) << b;
    }
    EXPECT_DOUBLE_EQ(e.hidden_share(), 1.0);

    // Control: without a stamp the reducer polls, so a completion can be no
    // later than the end of its own end-of-backward work.
    StampingGroup none(real, std::nullopt);
    const StepStats p = one_step(none);
    for (std::size_t b = 0; b < p.buckets.size(); ++b) {
      EXPECT_GE(p.buckets[b].completed_ms, p.buckets[b].launched_ms) << b;
      EXPECT_LE(p.buckets[b].completed_ms, p.backward_ms + p.finalize_ms) << b;
      EXPECT_LT(p.buckets[b].completed_ms, p.buckets[b].launched_ms + kHourMs) << b;
    }
  });
}

}  // namespace
}  // namespace paratrain::ddp::testing

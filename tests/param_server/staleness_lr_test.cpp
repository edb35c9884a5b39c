// Staleness-aware learning rates (ps.staleness_aware_lr, Note
// [Staleness-aware learning rate] in param_server/server.cpp), servers and
// workers driven directly, ranks as threads: under async every push of a
// gradient of ones moves the server's parameters by exactly lr / max(tau, 1),
// tau being the staleness the server reported for it; switched off, by lr
// whatever tau. Under ssp each clock moves by lr over its gradients' mean
// staleness. One slowed worker makes stale pushes happen (checked, so the
// two cannot agree by accident).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "paratrain/param_server/server.h"
#include "paratrain/param_server/worker.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

constexpr int kWorkers = 3;
constexpr int kSteps = 10;
constexpr double kLr = 0.1;

struct Outcome {
  std::mutex mu;
  std::map<int64_t, int64_t> staleness;  // over every worker's pushes: tau -> count
  double moved = 0;                       // how far the server's parameters went (all elements alike)
};

void run(bool aware, Outcome& out, Mode mode = Mode::kAsync, int64_t bound = 0) {
  paratrain::testing::run_ranks(kWorkers + 1, [&](comm::ProcessGroup& g) {
    const Roles roles = Roles::for_world(g.size(), 1);
    std::vector<at::Tensor> params{torch::zeros({4})};
    const auto plan = plan_key_ranges({4}, {4}, 1);
    const auto buckets = plan_buckets(plan, {}, {4}, 0);
    if (roles.is_server(g.rank())) {
      ServerOptions options{mode, bound, std::chrono::seconds(60)};
      options.staleness_aware_lr = aware;
      Server server(g, roles, plan, buckets, params, options);
      torch::optim::SGD sgd(server.pieces(), torch::optim::SGDOptions(kLr));
      server.expect_pushes(kSteps);
      for (int r = 0; r < kSteps; ++r) server.serve_round(sgd);
      std::lock_guard<std::mutex> lock(out.mu);
      out.moved = -server.pieces()[0][0].item<double>();
      EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), kLr);  // the schedule's rate is restored
      return;
    }
    Worker worker(g, roles, plan, buckets, params, WorkerOptions{std::chrono::seconds(60)});
    params[0].mutable_grad() = torch::ones({4});
    for (int c = 0; c < kSteps; ++c) {
      if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      worker.push_pull();
    }
    std::lock_guard<std::mutex> lock(out.mu);
    for (const auto& [tau, n] : worker.staleness_histogram()) out.staleness[tau] += n;
  });
}

TEST(StalenessAwareLr, EachAsyncUpdateMovesByTheRateOverItsStaleness) {
  Outcome aware, plain;
  run(true, aware);
  run(false, plain);
  for (auto* o : {&aware, &plain}) {
    int64_t pushes = 0;
    for (const auto& [tau, n] : o->staleness) pushes += n;
    ASSERT_EQ(pushes, kWorkers * kSteps);
  }
  ASSERT_GE(aware.staleness.rbegin()->first, 2) << "no stale push: the check could not tell the rates apart";
  double expected = 0;
  for (const auto& [tau, n] : aware.staleness) expected += n * kLr / std::max<int64_t>(tau, 1);
  EXPECT_NEAR(aware.moved, expected, 1e-5);
  EXPECT_NEAR(plain.moved, kWorkers * kSteps * kLr, 1e-5);
  EXPECT_LT(aware.moved, plain.moved - 0.05);
}

// Under ssp a clock's update is the mean of every worker's gradient for it,
// at the rate over their mean staleness: with a bound of 3 and a slowed
// worker some clocks are stale, and the server moves less than at the full
// rate (but at least the rate over the largest staleness seen); with a
// bound of 0 every gradient is fresh, and aware and plain move alike.
TEST(StalenessAwareLr, SspClocksMoveByTheRateOverTheirMeanStaleness) {
  Outcome aware, plain, fresh;
  run(true, aware, Mode::kSsp, 3);
  run(false, plain, Mode::kSsp, 3);
  run(true, fresh, Mode::kSsp, 0);
  ASSERT_GE(aware.staleness.rbegin()->first, 2) << "no stale push: the check could not tell the rates apart";
  EXPECT_NEAR(plain.moved, kSteps * kLr, 1e-5);  // one update per clock, of the mean gradient (ones)
  EXPECT_LT(aware.moved, plain.moved - 0.01);
  EXPECT_GE(aware.moved, kSteps * kLr / static_cast<double>(aware.staleness.rbegin()->first) - 1e-5);
  EXPECT_EQ(fresh.staleness.rbegin()->first, 0);
  EXPECT_NEAR(fresh.moved, kSteps * kLr, 1e-5);
}

}  // namespace
}  // namespace paratrain::param_server

// Servers and workers driven directly (no Trainer), ranks as threads:
// under ssp no worker ever runs more than s clocks ahead of the slowest one,
// asserted from the clocks every worker records, with one slowed worker; the
// same run in async mode (no bound) shows the check can fail. And a server
// that dies makes the workers fail fast with its role and rank named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "paratrain/core/error.h"
#include "paratrain/param_server/server.h"
#include "paratrain/param_server/worker.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

constexpr int kWorkers = 3;
constexpr int kSteps = 12;

struct Recorded {
  std::atomic<int64_t> pushed[kWorkers] = {};
  std::mutex mu;
  int64_t max_lead = 0;            // over every worker and clock
  int64_t max_staleness = 0;       // from the workers' histograms
};

// Every worker pushes a gradient of ones kSteps times; worker 0 sleeps
// before each push. A worker "at clock c" is one whose c-th push_pull
// returned: it may compute clock c + 1. Its lead is c minus the clock the
// slowest worker has pushed by then.
void run(Mode mode, int64_t staleness, Recorded& rec) {
  paratrain::testing::run_ranks(kWorkers + 1, [&](comm::ProcessGroup& g) {
    const Roles roles = Roles::for_world(g.size(), 1);
    std::vector<at::Tensor> params{torch::zeros({5, 2})};
    const auto plan = plan_key_ranges({10}, {4}, 1);
    const auto buckets = plan_buckets(plan, {}, {4}, 0);
    if (roles.is_server(g.rank())) {
      Server server(g, roles, plan, buckets, params, {mode, staleness, std::chrono::seconds(60)});
      torch::optim::SGD sgd(server.pieces(), torch::optim::SGDOptions(0.1));
      server.expect_pushes(kSteps);
      for (int r = 0; r < kSteps; ++r) server.serve_round(sgd);
      return;
    }
    const int w = g.rank();
    Worker worker(g, roles, plan, buckets, params, WorkerOptions{std::chrono::seconds(60)});
    params[0].mutable_grad() = torch::ones({5, 2});
    for (int64_t c = 1; c <= kSteps; ++c) {
      if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      rec.pushed[w].store(c);
      worker.push_pull();
      int64_t slowest = c;
      for (int x = 0; x < kWorkers; ++x) slowest = std::min(slowest, rec.pushed[x].load());
      std::lock_guard<std::mutex> lock(rec.mu);
      rec.max_lead = std::max(rec.max_lead, c - slowest);
    }
    std::lock_guard<std::mutex> lock(rec.mu);
    rec.max_staleness = std::max(rec.max_staleness, worker.staleness_histogram().rbegin()->first);
  });
}

TEST(Ssp, NoWorkerRunsMoreThanStalenessAheadOfTheSlowest) {
  for (int64_t s : {1, 2}) {
    Recorded rec;
    run(Mode::kSsp, s, rec);
    EXPECT_LE(rec.max_lead, s) << "staleness " << s;
    EXPECT_GE(rec.max_lead, 1) << "the fast workers never ran ahead: the run did not exercise the bound";
    EXPECT_LE(rec.max_staleness, s);
    EXPECT_GE(rec.max_staleness, 1);
  }
}

TEST(Ssp, NegativeControlAsyncRunsFurtherAhead) {
  Recorded rec;
  run(Mode::kAsync, 0, rec);
  EXPECT_GT(rec.max_lead, 2);
}

TEST(ServerFailure, WorkersFailFastNamingTheDeadServer) {
  std::vector<std::string> errors(2);
  std::vector<bool> timed_out(2, false);
  paratrain::testing::run_ranks(3, [&](comm::ProcessGroup& g) {
    const Roles roles = Roles::for_world(g.size(), 1);
    std::vector<at::Tensor> params{torch::zeros({4})};
    const auto plan = plan_key_ranges({4}, {4}, 1);
    const auto buckets = plan_buckets(plan, {}, {4}, 0);
    // A long timeout: the workers must learn of the death from the closed
    // connections, not by timing out.
    const auto timeout = std::chrono::seconds(120);
    if (roles.is_server(g.rank())) {
      Server server(g, roles, plan, buckets, params, {Mode::kSync, 0, timeout});
      torch::optim::SGD sgd(server.pieces(), torch::optim::SGDOptions(0.1));
      for (int r = 0; r < 3; ++r) server.serve_round(sgd);
      g.abort();  // dies: its connections close
      return;
    }
    Worker worker(g, roles, plan, buckets, params, WorkerOptions{timeout});
    params[0].mutable_grad() = torch::ones({4});
    try {
      for (int c = 0; c < 10; ++c) worker.push_pull();
    } catch (const TimeoutError& e) {
      timed_out[g.rank()] = true;
      errors[g.rank()] = e.what();
    } catch (const CommError& e) {
      errors[g.rank()] = e.what();
    }
  }, std::chrono::seconds(120));
  for (int w = 0; w < 2; ++w) {
    EXPECT_FALSE(timed_out[w]) << errors[w];
    EXPECT_NE(errors[w].find("parameter server 0 (rank 2)"), std::string::npos) << errors[w];
    EXPECT_NE(errors[w].find("worker " + std::to_string(w)), std::string::npos) << errors[w];
  }
}

}  // namespace
}  // namespace paratrain::param_server

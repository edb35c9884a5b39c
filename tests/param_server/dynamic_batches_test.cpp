// Dynamic batch assignment under async (Note [Dynamic batches] in
// param_server/server.h). Servers and workers driven directly, ranks as
// threads, worker 0 slowed: every item of each window is trained exactly
// once and the fast workers take more of them (with fixed shares, the
// control, each would take the same number). The items of an epoch hold
// exactly the examples of the fixed shares. Through the Trainer: an async
// run with a slowed worker ends with the fast workers having pushed more,
// all pushes adding up to the planned steps, checkpoints at the windows'
// ends; ssp (fixed shares) is the control with equal counts, and so is
// async with ps.dynamic_batches = false.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "paratrain/param_server/item_queue.h"
#include "paratrain/param_server/server.h"
#include "paratrain/param_server/worker.h"
#include "paratrain/train/loop/batch_items.h"
#include "paratrain/train/trainer.h"
#include "tests/param_server/ps_training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

constexpr int kWorkers = 3;

// Items each worker trained, per window, in the order it trained them.
using Taken = std::vector<std::vector<std::vector<int64_t>>>;  // [window][worker]

// Two windows (steps 0..7 and 8..13 of an epoch) on `servers` servers;
// worker 0 sleeps before each step.
Taken run_windows(int servers) {
  const std::vector<std::pair<int64_t, int64_t>> windows{{0, 8}, {8, 6}};
  Taken taken(windows.size(), std::vector<std::vector<int64_t>>(kWorkers));
  std::mutex mu;
  paratrain::testing::run_ranks(kWorkers + servers, [&](comm::ProcessGroup& g) {
    const Roles roles = Roles::for_world(g.size(), servers);
    std::vector<at::Tensor> params{torch::zeros({6, 2})};
    const auto plan = plan_key_ranges({12}, {4}, servers);
    const auto buckets = plan_buckets(plan, {}, {4}, 0);
    if (roles.is_server(g.rank())) {
      Server server(g, roles, plan, buckets, params, {Mode::kAsync, 0, std::chrono::seconds(60)});
      torch::optim::SGD sgd(server.pieces(), torch::optim::SGDOptions(0.1));
      for (const auto& [first, steps] : windows) {
        server.begin_window(kWorkers * first, steps);
        for (int64_t r = 0; r < steps; ++r) server.serve_round(sgd);
      }
      return;
    }
    const int w = g.rank();
    Worker worker(g, roles, plan, buckets, params, WorkerOptions{std::chrono::seconds(60)});
    ItemQueue queue;
    for (size_t i = 0; i < windows.size(); ++i) {
      queue.begin_window(w, kWorkers, windows[i].first, windows[i].second);
      bool last = false;
      for (int64_t item = queue.next(-1, last); item >= 0; item = queue.next(worker.assigned_item(), last)) {
        // A decisive straggler: at 30 ms a fast worker starved by a loaded
        // 2-core machine once took no more than it (issue 23).
        if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        params[0].mutable_grad() = torch::full({6, 2}, static_cast<float>(item));
        worker.set_last_push(last);
        worker.push_pull();
        std::lock_guard<std::mutex> lock(mu);
        taken[i][w].push_back(item);
      }
    }
  });
  return taken;
}

TEST(DynamicBatches, EveryItemOnceAndFastWorkersTakeMore) {
  for (int servers : {1, 2}) {
    const Taken taken = run_windows(servers);
    const std::vector<std::pair<int64_t, int64_t>> windows{{0, 8}, {8, 6}};
    for (size_t i = 0; i < windows.size(); ++i) {
      std::vector<int64_t> all;
      for (const auto& items : taken[i]) {
        EXPECT_TRUE(std::is_sorted(items.begin(), items.end())) << "items are handed out in order";
        all.insert(all.end(), items.begin(), items.end());
      }
      std::sort(all.begin(), all.end());
      std::vector<int64_t> want(kWorkers * windows[i].second);
      for (size_t j = 0; j < want.size(); ++j) want[j] = kWorkers * windows[i].first + static_cast<int64_t>(j);
      EXPECT_EQ(all, want) << servers << " servers, window " << i << ": each item exactly once";
      // Fixed shares would give each worker steps items: the control.
      const auto slow = static_cast<int64_t>(taken[i][0].size());
      for (int w = 1; w < kWorkers; ++w) {
        EXPECT_GT(static_cast<int64_t>(taken[i][w].size()), slow)
            << servers << " servers, window " << i << ": fast worker " << w << " took no more than the slowed one";
      }
      EXPECT_LT(slow, windows[i].second);
    }
  }
}

TEST(DynamicBatches, TheLastItemOfAWindowIsMarkedExactlyOnce) {
  ItemQueue queue;
  queue.begin_window(1, 3, 2, 1);  // one step: items 6, 7, 8; worker 1 holds 7 only
  bool last = false;
  EXPECT_EQ(queue.next(-1, last), 7);
  EXPECT_TRUE(last);
  EXPECT_EQ(queue.next(-1, last), -1);
  queue.begin_window(1, 3, 0, 4);  // items 0..11: worker 1 holds 1 and 4
  EXPECT_EQ(queue.next(99, last), 1) << "an answer before the window's first push is ignored";
  EXPECT_FALSE(last);
  EXPECT_EQ(queue.next(9, last), 4);
  EXPECT_FALSE(last);
  EXPECT_EQ(queue.next(-1, last), 9);
  EXPECT_TRUE(last) << "server 0 answered none: 9 is the last";
  EXPECT_EQ(queue.next(-1, last), -1);
}

TEST(DynamicBatches, TheItemsOfAnEpochHoldTheFixedSharesExamplesEachOnce) {
  data::SamplerOptions options;
  options.num_replicas = 3;
  options.seed = 5;
  const int64_t n = 90, batch = 4, accumulate = 2;  // 30 per share: 3 steps of 8 and a partial
  const train::EpochItems items(n, options, 2, batch, accumulate);
  std::vector<int64_t> rows;
  for (int64_t item = 0; item < 3 * 4; ++item) {
    for (int64_t m = 0; m < accumulate; ++m) {
      auto r = items.rows(item, m).contiguous();
      rows.insert(rows.end(), r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
    }
  }
  std::sort(rows.begin(), rows.end());
  std::vector<int64_t> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = i;
  EXPECT_EQ(rows, want);
  // Item 4 is rank 1's second step: its loader batches 2 and 3.
  options.rank = 1;
  data::DistributedSampler share(n, options);
  share.set_epoch(2);
  EXPECT_TRUE(torch::equal(items.rows(4, 0), share.indices().slice(0, 8, 12)));
  EXPECT_TRUE(torch::equal(items.rows(4, 1), share.indices().slice(0, 12, 16)));
}

// Pushes per worker from the run's ps_staleness records.
std::vector<int64_t> pushes_of(const std::string& run_dir) {
  std::vector<int64_t> out;
  for (const auto& j : testing::worker_records(run_dir)) out.push_back(j["pushes"].get<int64_t>());
  return out;
}

TEST(DynamicBatches, TrainerAsyncWithASlowedWorkerLetsTheOthersTakeMoreBatches) {
  auto dir = paratrain::testing::temp_dir("ps_dynamic");
  auto cfg = testing::small_config(dir + "/async", "sgd");
  cfg.ps.servers = 1;
  cfg.ps.mode = "async";
  cfg.ps.slow_worker = 0;
  cfg.ps.slow_ms = 15;
  cfg.train.epochs = 2;
  cfg.train.max_steps = 0;  // 2 epochs of 20 steps
  cfg.train.eval_every_epochs = 1;
  cfg.train.checkpoint_every_steps = 7;  // windows end at steps 7, 14, 20, 21, 28, 35, 40
  cfg.run.log_every = 5;                 // rank 0's local lines: no collective mid-window
  const auto params = testing::train(cfg, kWorkers + 1);
  for (const auto& [name, p] : params) EXPECT_TRUE(p.isfinite().all().item<bool>()) << name;
  const auto pushes = pushes_of(dir + "/async/t/version_0");
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[0] + pushes[1] + pushes[2], kWorkers * 40) << "every item of both epochs, once";
  EXPECT_LT(pushes[0], pushes[1]);
  EXPECT_LT(pushes[0], pushes[2]);
  for (int step : {7, 14, 20, 21, 28, 35, 40}) {
    EXPECT_TRUE(std::filesystem::exists(fmt::format("{}/async/t/version_0/checkpoints/step_{:08d}/index.json", dir,
                                                    step)))
        << "no checkpoint at step " << step;
  }
  // The control: ssp keeps fixed shares, so every worker pushes 40 times.
  auto ssp = testing::small_config(dir + "/ssp", "sgd");
  ssp.ps.servers = 1;
  ssp.ps.mode = "ssp";
  ssp.ps.slow_worker = 0;
  ssp.ps.slow_ms = 15;
  ssp.train.epochs = 2;
  ssp.train.max_steps = 0;
  testing::train(ssp, kWorkers + 1);
  EXPECT_EQ(pushes_of(dir + "/ssp/t/version_0"), (std::vector<int64_t>{40, 40, 40}));
}

// ps.dynamic_batches = false: async keeps each worker's fixed share, so the
// slowed worker pushes as often as the others (the test above, with the
// queue, is the control that shows the counts differ when it is on).
TEST(DynamicBatches, SwitchedOffAsyncKeepsFixedShares) {
  auto dir = paratrain::testing::temp_dir("ps_dynamic_off");
  auto cfg = testing::small_config(dir, "sgd");
  cfg.ps.servers = 1;
  cfg.ps.mode = "async";
  cfg.ps.dynamic_batches = false;
  cfg.ps.slow_worker = 0;
  cfg.ps.slow_ms = 15;
  cfg.train.eval_every_epochs = 1;
  const auto params = testing::train(cfg, kWorkers + 1);
  for (const auto& [name, p] : params) EXPECT_TRUE(p.isfinite().all().item<bool>()) << name;
  const auto records = testing::worker_records(dir + "/t/version_0");
  ASSERT_EQ(records.size(), 3u);
  for (const auto& r : records) {
    EXPECT_EQ(r["pushes"].get<int64_t>(), cfg.train.max_steps) << r;
    EXPECT_FALSE(r["dynamic_batches"].get<bool>()) << r;
  }
  EXPECT_EQ(train::config_from_toml_string("[ps]\nservers = 1\nmode = \"async\"\ndynamic_batches = false\n")
                .ps.dynamic_batches,
            false);
}

// A run stopped mid-epoch (train.max_steps) checkpoints at the window's
// end; resumed from there, the workers take exactly the epoch's remaining
// items (13 steps x 3 workers).
TEST(DynamicBatches, AResumedAsyncRunTrainsTheRestOfTheEpoch) {
  auto dir = paratrain::testing::temp_dir("ps_dynamic_resume");
  auto first = testing::small_config(dir + "/first", "sgd");
  first.ps.servers = 1;
  first.ps.mode = "async";
  first.ps.slow_worker = 2;
  first.ps.slow_ms = 5;
  first.train.max_steps = 7;
  testing::train(first, kWorkers + 1);
  EXPECT_EQ(pushes_of(dir + "/first/t/version_0").size(), 3u);
  auto rest = first;
  rest.run.output_dir = dir + "/rest";
  rest.train.max_steps = 20;
  rest.train.resume = dir + "/first/t/version_0/checkpoints/step_00000007";
  testing::train(rest, kWorkers + 1);
  const auto pushes = pushes_of(dir + "/rest/t/version_0");
  ASSERT_EQ(pushes.size(), 3u);
  EXPECT_EQ(pushes[0] + pushes[1] + pushes[2], kWorkers * 13);
}

}  // namespace
}  // namespace paratrain::param_server

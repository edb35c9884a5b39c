// How pulls travel: the servers answer one message per key range, and with
// ps.overlap a worker's next forward waits for each layer's ranges just
// before the layer runs (Note [Pulling during the forward] in
// train/strategies/ps_strategy.cpp). The worker uses a tensor's range while
// a server still holds the later ranges back (a whole-pull wait would time
// out there); through the Trainer the layer-by-layer forward equals the
// whole pull bit for bit (GPT, with its tied head, here; MLP in
// push_test.cpp) and one process to the oracle tolerance, its counters show
// the ranges waited for after the first layers ran, and a model without
// layers() falls back to the whole pull.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>

#include "paratrain/models/model.h"
#include "paratrain/param_server/bucket_plan.h"
#include "paratrain/param_server/key_ranges.h"
#include "paratrain/param_server/protocol.h"
#include "paratrain/param_server/worker.h"
#include "paratrain/train/registry.h"
#include "tests/param_server/ps_training.h"
#include "tests/support/multi_rank.h"

namespace paratrain::param_server {
namespace {

using testing::Params;
using testing::small_config;
using testing::train;
using testing::worker_records;

constexpr double kGptTolerance = 1e-5;  // absolute: Note [GPT oracle tolerance] in tests/text_gpt

void expect_equal(const Params& a, const Params& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

// Rank 1 plays a server by hand: it answers range 0 of the pull at once and
// sends ranges 1 and 2 only after the worker (rank 0) has used range 0. A
// worker that waited for the whole pull before using any of it would never
// get there: its wait times out and the test fails.
TEST(PsPullWorker, ATensorIsUsableWhileTheServerStillHoldsTheLaterRanges) {
  const std::vector<int64_t> numel{4, 3, 2};
  const auto plan = plan_key_ranges(numel, {4, 4, 4}, 1);  // one server: one range per tensor
  const auto buckets = plan_buckets(plan, {}, {4, 4, 4}, 0);  // one message per range
  std::promise<void> first_used;
  auto used = first_used.get_future();
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    const Roles roles = Roles::for_world(2, 1);
    if (roles.is_server(g.rank())) {
      for (int k = 0; k < 3; ++k) {
        auto push = torch::empty({push_message_numel(numel[k], PushDtype::kFp32)}, torch::kFloat);
        g.recv(push, 0, push_tag(k))->wait(std::chrono::seconds(20));
      }
      auto answer = [&](int k) {
        auto header = torch::tensor({1.0f, 0.0f, -1.0f});
        auto message = torch::cat({header, torch::full({numel[k]}, 10.0f + k)});
        g.send(message, 0, reply_tag(k))->wait(std::chrono::seconds(20));
      };
      answer(0);
      ASSERT_EQ(used.wait_for(std::chrono::seconds(40)), std::future_status::ready)
          << "the worker did not use tensor 0 before the rest of the pull came";
      answer(1);
      answer(2);
      return;
    }
    std::vector<at::Tensor> params;
    for (int64_t n : numel) {
      params.push_back(torch::zeros({n}));
      params.back().mutable_grad() = torch::ones({n});
    }
    Worker worker(g, roles, plan, buckets, params, WorkerOptions{std::chrono::seconds(20)});
    worker.push();
    EXPECT_EQ(worker.ranges_due(), 3);
    worker.pull_tensor(0);
    EXPECT_TRUE(torch::equal(params[0], torch::full({4}, 10.0f)));
    EXPECT_TRUE(torch::equal(params[1], torch::zeros({3}))) << "range 1 cannot have come yet";
    EXPECT_TRUE(worker.pull_pending());
    EXPECT_EQ(worker.ranges_due(), 2);
    first_used.set_value();
    worker.pull_tensor(2);
    EXPECT_TRUE(torch::equal(params[2], torch::full({2}, 12.0f)));
    EXPECT_EQ(worker.ranges_due(), 1);
    EXPECT_EQ(worker.pull(), 0);
    EXPECT_TRUE(torch::equal(params[1], torch::full({3}, 11.0f)));
    EXPECT_FALSE(worker.pull_pending());
    EXPECT_EQ(worker.ranges_due(), 0);
  });
}

// A tiny GPT on one of Debian's fortune files: real text, tokenized per
// run into its output directory.
train::TrainConfig gpt_config(const std::string& dir) {
  auto c = small_config(dir, "adamw");
  c.model.kind = "gpt";
  c.model.layers = 2;
  c.model.d_model = 16;
  c.model.heads = 2;
  c.model.seq_len = 16;
  c.model.dropout = 0.0;
  c.model.hidden = {};
  c.data.dataset = "text";
  c.data.path = "/usr/share/games/fortunes/debian";
  c.data.global_batch_size = 8;
  c.optimizer.lr = 3e-3;
  c.train.max_steps = 6;  // AdamW against one process: before float-order noise can part them (issue 23)
  return c;
}

// GPT's layers are embed, blocks.0, blocks.1, head; the head reads wte, which
// embed owns, so wte is waited for before embed. With one server every
// tensor is one range: embed's 2 (wte, wpe) before the first layer, the 12
// of each block and ln_f's 2 after layers had run.
TEST(PsPullInForward, GptWaitsPerLayerAndEqualsTheWholePullAndOneProcess) {
  auto dir = paratrain::testing::temp_dir("ps_pull_gpt");
  const Params single = train(gpt_config(dir + "/single"), 1);
  Params runs[2];
  for (bool overlap : {false, true}) {
    auto cfg = gpt_config(dir + (overlap ? "/overlap" : "/whole"));
    cfg.ps.servers = 1;
    cfg.ps.overlap = overlap;
    cfg.ps.bucket_kb = 0;  // a message per range, counted below (buckets: bucket_test.cpp)
    runs[overlap] = train(cfg, 3);
    // Note [GPT oracle tolerance] (tests/text_gpt): absolute, since AdamW
    // moves the zero-initialised biases by a few lr only, so a relative
    // difference there is one of tiny values.
    double worst = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      worst = std::max(worst, (runs[overlap][i].second - single[i].second).abs().max().item<double>());
    }
    RecordProperty(overlap ? "max_abs_diff_overlap" : "max_abs_diff_whole", fmt::format("{:.3g}", worst));
    EXPECT_LT(worst, kGptTolerance) << "overlap " << overlap;
    const auto records = worker_records(cfg.run.output_dir + "/t/version_0");
    ASSERT_EQ(records.size(), 2u);
    const int64_t pulls = cfg.train.max_steps - 1;  // the first forward has nothing due
    for (const auto& r : records) {
      EXPECT_EQ(r["forwards_pulling"].get<int64_t>(), overlap ? pulls : 0) << r;
      EXPECT_EQ(r["ranges_pulled_in_forward"].get<int64_t>(), overlap ? (2 * 12 + 2) * pulls : 0) << r;
    }
  }
  expect_equal(runs[true], runs[false]);
}

// A user model that cannot list its layers: one Linear on the flattened
// 6x6 images of small_config.
class WholeModel : public models::Model {
 public:
  WholeModel() : Model("whole") { fc_ = register_module("fc", torch::nn::Linear(36, 10)); }
  at::Tensor forward(const at::Tensor& x) override { return fc_(x.reshape({x.size(0), 36})); }

 private:
  torch::nn::Linear fc_{nullptr};
};

TEST(PsPullInForward, AModelWithoutLayersWaitsForTheWholePull) {
  train::register_model("ps_test_whole_model", [](const train::TrainConfig&) { return std::make_shared<WholeModel>(); });
  auto dir = paratrain::testing::temp_dir("ps_pull_whole");
  Params runs[2];
  for (bool overlap : {false, true}) {
    auto cfg = small_config(dir + (overlap ? "/overlap" : "/whole"), "sgd");
    cfg.model.kind = "ps_test_whole_model";
    cfg.ps.servers = 1;
    cfg.ps.overlap = overlap;
    runs[overlap] = train(cfg, 3);
    for (const auto& r : worker_records(cfg.run.output_dir + "/t/version_0")) {
      EXPECT_EQ(r["forwards_pulling"].get<int64_t>(), 0) << r;
      EXPECT_EQ(r["ranges_pulled_in_forward"].get<int64_t>(), 0) << r;
      EXPECT_EQ(r["ranges_pushed_in_backward"].get<int64_t>(), overlap ? 2 * cfg.train.max_steps : 0) << r;
    }
  }
  expect_equal(runs[true], runs[false]);
}

}  // namespace
}  // namespace paratrain::param_server

// Client processes that die, at the level of ranks as threads: a host whose
// group is aborted (its sockets close, as when its process dies) is found
// lost by the server, its clients are dropped from the round and never
// sampled again, and the run goes on with the other host; the deadline rule
// on its own. The real-process version (SIGKILL under `paratrain launch`) is
// in federated_cli_test.cpp. The control for all of them: with the round's
// upload a collective (as before), a dead rank fails or hangs the round.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "paratrain/federated/client.h"
#include "paratrain/federated/round.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::federated {
namespace {

TEST(RoundCanClose, EveryLiveClientOrTheDeadlineWithMinClients) {
  EXPECT_TRUE(round_can_close(0, 0, 1, false));   // nobody left to wait for (a skipped round)
  EXPECT_TRUE(round_can_close(0, 5, 1, false));   // everyone reported
  EXPECT_FALSE(round_can_close(2, 5, 1, false));  // before the deadline: wait for the rest
  EXPECT_TRUE(round_can_close(2, 5, 5, true));    // after it, min_clients in hand: close
  EXPECT_FALSE(round_can_close(2, 4, 5, true));   // after it, too few: keep waiting
}

TEST(LostClientProcess, TheServerDropsItsClientsAndGoesOnWithTheOthers) {
  train::TrainConfig c;
  c.data.dataset = "synthetic";
  c.data.synthetic_image_size = 4;
  c.data.synthetic_classes = 3;
  c.data.batch_size = 8;
  c.model.kind = "mlp";
  c.model.hidden = {8};
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.0;
  c.federated.clients = 6;  // rank 1 hosts 0, 2, 4; rank 2 hosts 1, 3, 5
  c.federated.fraction = 1.0;
  c.federated.local_steps = 2;
  c.run.seed = 5;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const data::TensorDataset train(at::randn({96, 1, 4, 4}, gen), at::randint(0, 3, {96}, gen, at::kLong));
  std::vector<std::shared_ptr<models::Model>> models;
  for (int r = 0; r < 3; ++r) models.push_back(testing::seeded(42, [&] { return train::make_model(c); }));
  constexpr int64_t kRounds = 4;
  std::vector<RoundReport> reports;
  std::vector<at::Tensor> globals;
  testing::run_ranks(3, [&](comm::ProcessGroup& group) {
    FederatedRun run(c, group, models[group.rank()], train);
    if (group.rank() == 0) {
      for (int64_t r = 1; r <= kRounds; ++r) {
        reports.push_back(run.run_round(r));
        globals.push_back(run.global().clone());
      }
      EXPECT_EQ(run.lost_ranks(), std::vector<int>{2});
      return;
    }
    run.run_round(1);
    if (group.rank() == 2) {
      // Dies after round 1: its connections close as a killed process's do.
      group.abort();
      return;
    }
    for (int64_t r = 2; r <= kRounds; ++r) run.run_round(r);
  });
  ASSERT_EQ(reports.size(), static_cast<size_t>(kRounds));
  EXPECT_EQ(reports[0].reported, 6);
  EXPECT_TRUE(reports[0].lost.empty());
  // The loss is found at the end of round 1, at round 2's start or during it
  // (the abort races the server); either way rank 2 is reported exactly
  // once, any of its clients sampled in round 2 is dropped as lost, and
  // later rounds sample only rank 1's clients.
  std::vector<int> lost;
  for (const auto& r : reports) lost.insert(lost.end(), r.lost_ranks.begin(), r.lost_ranks.end());
  EXPECT_EQ(lost, std::vector<int>{2});
  for (int64_t c2 : reports[1].sampled) {
    if (c2 % 2 == 1) {
      EXPECT_NE(std::find(reports[1].lost.begin(), reports[1].lost.end(), c2), reports[1].lost.end());
    }
  }
  for (size_t i = 1; i < reports.size(); ++i) {
    EXPECT_TRUE(reports[i].applied) << "round " << i + 1;
    EXPECT_EQ(reports[i].reported, 3) << "round " << i + 1;
    if (i >= 2) {
      EXPECT_EQ(reports[i].sampled, (std::vector<int64_t>{0, 2, 4}));
      EXPECT_EQ(reports[i].pool, 3);
    }
  }
  // Every round moved the global model.
  for (size_t i = 1; i < globals.size(); ++i)
    EXPECT_GT((globals[i] - globals[i - 1]).abs().max().item<double>(), 1e-4) << "round " << i + 1;
}

}  // namespace
}  // namespace paratrain::federated

// FedAvg, FedProx and the adaptive server optimizers against single-process
// oracles, on 1 process (server and clients together) and on 2-3 ranks
// (server + client hosts, as threads):
// - one client, one full-batch local step, full participation = one SGD step
//   of one process on that client's data;
// - k equal clients, one full-batch step each = one GD step on the union
//   (the mean of the clients' gradients is the union's gradient);
// - FedProx: two proximal local steps written out by hand; mu = 0 is FedAvg;
// - FedAdam: the server step on the FedAvg delta;
// - a round closed by its deadline = GD on the union of the clients that
//   reported in time (a straggler host is held back until the server closed);
// - federated.client_optimizer_state = "keep": one client's momentum carried
//   across two rounds = two steps of momentum SGD on one process.
// Every oracle is also checked to be far (> 100x the tolerance) from what a
// switched-off feature gives: the initial model, or a round that drops
// clients.
// Tolerance 1e-6 (absolute, weights ~0.3): float32 sums of 16-64 rows in
// different orders (the client shuffles its rows) differ by ~1e-7.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <future>

#include "paratrain/federated/client.h"
#include "paratrain/federated/round.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"

namespace paratrain::federated {
namespace {

constexpr double kTol = 1e-6;

train::TrainConfig small_config(int64_t clients, int64_t batch) {
  train::TrainConfig c;
  c.data.dataset = "synthetic";
  c.data.synthetic_image_size = 4;
  c.data.synthetic_classes = 3;
  c.data.batch_size = batch;
  c.model.kind = "mlp";
  c.model.hidden = {8};
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.5;
  c.optimizer.momentum = 0.0;
  c.federated.clients = clients;
  c.federated.fraction = 1.0;
  c.federated.local_steps = 1;
  c.run.seed = 3;
  return c;
}

// Rows drawn from an explicit generator (never torch's global one).
data::TensorDataset make_data(int64_t rows, uint64_t seed = 1) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return data::TensorDataset(at::randn({rows, 1, 4, 4}, gen), at::randint(0, 3, {rows}, gen, at::kLong));
}

// One model per rank, built here on the test thread from one seed; rank 0's
// weights become the global model.
std::vector<std::shared_ptr<models::Model>> models_for(const train::TrainConfig& c, int ranks) {
  std::vector<std::shared_ptr<models::Model>> out;
  torch::manual_seed(42);
  for (int r = 0; r < ranks; ++r) out.push_back(train::make_model(c));
  return out;
}

// Runs `rounds` rounds on `ranks` ranks; returns the server's global model.
at::Tensor federated_global(const train::TrainConfig& c, const data::TensorDataset& train, int ranks,
                            int64_t rounds = 1) {
  auto models = models_for(c, ranks);
  at::Tensor result;
  testing::run_ranks(ranks, [&](comm::ProcessGroup& group) {
    FederatedRun run(c, group, models[group.rank()], train);
    for (int64_t r = 1; r <= rounds; ++r) run.run_round(r);
    if (group.rank() == 0) result = run.global().clone();
  });
  return result;
}

at::Tensor initial_global(const train::TrainConfig& c) { return flatten_parameters(*models_for(c, 1)[0]); }

// x - lr * grad of the mean cross-entropy over `data` at x (plus mu (x - anchor)).
at::Tensor gd_step(models::Model& model, const at::Tensor& x, const data::TensorDataset& data, double lr,
                   double mu = 0.0, const at::Tensor& anchor = {}) {
  load_flat_parameters(model, x);
  for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  torch::nn::functional::cross_entropy(model.forward(data.inputs), data.targets).backward();
  std::vector<at::Tensor> grads;
  for (auto& p : model.parameters()) grads.push_back(p.grad().flatten());
  auto g = torch::cat(grads);
  if (mu > 0) g = g + mu * (x - anchor);
  return x - lr * g;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The measured gap to the oracle, printed so a run shows how far inside the
// tolerance it is.
double oracle_gap(const at::Tensor& got, const at::Tensor& oracle, const char* what, int ranks) {
  const double gap = max_diff(got, oracle);
  std::printf("  %s, %d rank(s): max |federated - oracle| = %.3g\n", what, ranks, gap);
  return gap;
}

TEST(FedAvg, OneClientOneStepEqualsSgdOnItsData) {
  const auto train = make_data(24);
  auto c = small_config(1, 24);
  const auto x0 = initial_global(c);
  auto oracle_model = models_for(c, 1)[0];
  const auto oracle = gd_step(*oracle_model, x0, train, c.optimizer.lr);
  ASSERT_GT(max_diff(oracle, x0), 100 * kTol);  // the control: a round that changed nothing fails
  for (int ranks : {1, 2}) {
    const auto got = federated_global(c, train, ranks);
    EXPECT_LT(oracle_gap(got, oracle, "one client vs SGD", ranks), kTol);
  }
}

TEST(FedAvg, EqualClientsOneFullBatchStepEqualLargeBatchGd) {
  const auto train = make_data(64);
  auto c = small_config(4, 16);  // IID: 16 rows per client, one full-batch step each
  const auto x0 = initial_global(c);
  auto oracle_model = models_for(c, 1)[0];
  const auto oracle = gd_step(*oracle_model, x0, train, c.optimizer.lr);
  for (int ranks : {1, 3}) {
    const auto got = federated_global(c, train, ranks);
    EXPECT_LT(oracle_gap(got, oracle, "4 clients vs GD on the union", ranks), kTol);
  }
  // The control: half the clients (fraction 0.5) is not the union's step.
  c.federated.fraction = 0.5;
  EXPECT_GT(max_diff(federated_global(c, train, 1), oracle), 100 * kTol);
}

TEST(FedAvg, WeightsUnequalClientsBySampleCount) {
  // 3 clients of 10, 10 and 11 rows (IID split of 31): the weighted mean of
  // their full-batch steps is the union's step; an unweighted mean is not.
  const auto train = make_data(31);
  auto c = small_config(3, 64);
  const auto x0 = initial_global(c);
  auto oracle_model = models_for(c, 1)[0];
  const auto oracle = gd_step(*oracle_model, x0, train, c.optimizer.lr);
  EXPECT_LT(oracle_gap(federated_global(c, train, 2), oracle, "3 unequal clients vs GD on the union", 2), kTol);
}

TEST(FedProx, TwoProximalStepsMatchTheHandWrittenUpdate) {
  const auto train = make_data(20);
  auto c = small_config(1, 20);
  c.federated.local_steps = 2;
  c.federated.algorithm = "fedprox";
  c.federated.mu = 0.7;
  const auto x0 = initial_global(c);
  auto m = models_for(c, 1)[0];
  const auto x1 = gd_step(*m, x0, train, c.optimizer.lr, c.federated.mu, x0);
  const auto oracle = gd_step(*m, x1, train, c.optimizer.lr, c.federated.mu, x0);
  const auto plain = gd_step(*m, x1, train, c.optimizer.lr);
  ASSERT_GT(max_diff(oracle, plain), 100 * kTol);  // the prox term matters on step two
  EXPECT_LT(oracle_gap(federated_global(c, train, 2), oracle, "FedProx vs hand-written prox GD", 2), kTol);
}

TEST(FedProx, MuZeroIsFedAvgAndMuPositiveIsNot) {
  const auto train = make_data(48);
  auto c = small_config(4, 4);  // 12 rows per client, 3 mini-batches per local epoch
  c.federated.local_steps = 0;
  c.federated.local_epochs = 2;
  c.federated.fraction = 0.5;
  const auto fedavg = federated_global(c, train, 1, 3);
  c.federated.algorithm = "fedprox";
  c.federated.mu = 0.0;
  EXPECT_LT(max_diff(federated_global(c, train, 1, 3), fedavg), kTol);
  c.federated.mu = 1.0;
  EXPECT_GT(max_diff(federated_global(c, train, 1, 3), fedavg), 100 * kTol);
}

TEST(FedAdam, ServerStepAppliesTheAdaptiveFormulaToTheFedAvgDelta) {
  const auto train = make_data(32);
  auto c = small_config(2, 16);
  const auto x0 = initial_global(c);
  const auto delta = federated_global(c, train, 1) - x0;  // sgd, lr 1: x1 - x0 is the mean delta
  c.federated.server_optimizer = "adam";
  c.federated.server_lr = 0.01;
  c.federated.server_betas = {0.9, 0.99};
  c.federated.server_tau = 1e-3;
  const double b1 = 0.9, b2 = 0.99, tau = 1e-3;
  const auto m = (1 - b1) * delta;
  const auto v = b2 * tau * tau + (1 - b2) * delta * delta;
  const auto oracle = x0 + 0.01 * m / (v.sqrt() + tau);
  ASSERT_GT(max_diff(oracle, x0 + delta), 100 * kTol);
  EXPECT_LT(oracle_gap(federated_global(c, train, 3), oracle, "FedAdam vs formula", 3), kTol);
}

TEST(Rounds, TooFewReportsSkipTheRoundAndKeepTheModel) {
  const auto train = make_data(32);
  auto c = small_config(4, 8);
  c.federated.dropout = 1.0;  // every sampled client fails to report
  const auto x0 = initial_global(c);
  EXPECT_EQ(max_diff(federated_global(c, train, 2), x0), 0.0);
  // With some dropouts but min_clients met the round applies.
  c.federated.dropout = 0.0;
  c.federated.min_clients = 4;
  EXPECT_GT(max_diff(federated_global(c, train, 2), x0), 100 * kTol);
}

TEST(Deadline, ARoundClosedAtItsDeadlineAggregatesTheClientsThatReported) {
  const auto train = make_data(48);
  auto c = small_config(6, 8);  // 8 rows per client: one full-batch step each
  c.federated.round_timeout_s = 0.05;
  // Why 3: the round may close at the deadline only with 3 updates, and the
  // straggler host cannot send any before the round closed, so the 3 of the
  // other host are in the round however slow this machine is: nothing here
  // depends on timing.
  c.federated.min_clients = 3;
  auto models = models_for(c, 3);
  std::promise<void> closed;
  auto round_closed = closed.get_future().share();
  RoundReport report;
  at::Tensor got;
  Partition partition;
  testing::run_ranks(3, [&](comm::ProcessGroup& group) {
    FederatedRun run(c, group, models[group.rank()], train);
    if (group.rank() == 0) {
      // Released however the server's round ends, so the straggler never waits forever.
      struct Release {
        std::promise<void>& p;
        ~Release() { p.set_value(); }
      } release{closed};
      report = run.run_round(1);
      got = run.global().clone();
      partition = run.partition();
    } else {
      if (group.rank() == 2) round_closed.wait();  // the straggler: hosts clients 1, 3, 5
      run.run_round(1);
    }
  });
  EXPECT_EQ(report.late, (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(report.reported, 3);
  ASSERT_TRUE(report.applied);
  auto rows_of = [&](std::vector<int64_t> clients) {
    std::vector<int64_t> rows;
    for (int64_t k : clients) rows.insert(rows.end(), partition[k].begin(), partition[k].end());
    auto idx = torch::tensor(rows, torch::kLong);
    return data::TensorDataset(train.inputs.index_select(0, idx), train.targets.index_select(0, idx));
  };
  const auto x0 = initial_global(c);
  auto m = models_for(c, 1)[0];
  const auto oracle = gd_step(*m, x0, rows_of({0, 2, 4}), c.optimizer.lr);
  // The control: had the late clients been waited for, the step would differ.
  ASSERT_GT(max_diff(oracle, gd_step(*m, x0, train, c.optimizer.lr)), 100 * kTol);
  EXPECT_LT(oracle_gap(got, oracle, "deadline round vs GD on the clients in time", 3), kTol);
}

TEST(ClientOptimizerState, KeepCarriesOneClientsMomentumAcrossRounds) {
  const auto train = make_data(24);
  auto c = small_config(1, 24);  // one client, one full-batch step per round, FedAvg (server lr 1)
  c.optimizer.momentum = 0.9;
  const auto x0 = initial_global(c);
  // Two steps of momentum SGD on one process: buf = g0, then 0.9 g0 + g1.
  auto m = models_for(c, 1)[0];
  load_flat_parameters(*m, x0);
  auto sgd = train::make_optimizer(c.optimizer, m->parameters());
  for (int step = 0; step < 2; ++step) {
    sgd->zero_grad();
    torch::nn::functional::cross_entropy(m->forward(train.inputs), train.targets).backward();
    sgd->step();
  }
  const auto oracle = flatten_parameters(*m);
  c.federated.client_optimizer_state = "reset";
  const auto reset = federated_global(c, train, 2, 2);
  ASSERT_GT(max_diff(reset, oracle), 100 * kTol);  // the control: a fresh optimizer per round forgets g0
  c.federated.client_optimizer_state = "keep";
  for (int ranks : {1, 2}) {
    EXPECT_LT(oracle_gap(federated_global(c, train, ranks, 2), oracle, "kept momentum vs 2 SGD steps", ranks), kTol);
  }
}

}  // namespace
}  // namespace paratrain::federated

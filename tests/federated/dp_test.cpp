// DP-FedAvg: the RDP accountant against published reference values, and the
// round's clipping and noise: each client moves the global model by at most
// clip / m, and the noise on the mean has std z * clip / m.
//
// Reference: the RDP of the Poisson-sampled Gaussian for q = 0.01, z = 2.5,
// 50 compositions, and the RDP-to-(epsilon, delta) conversion for a constant
// RDP of 1.1 over orders 2..32 at delta = 1e-5, both from the test suite of
// Google's dp_accounting library (google/differential-privacy,
// python/dp_accounting/dp_accounting/rdp/rdp_privacy_accountant_test.py:
// test_compute_rdp_poisson_sampled_gaussian, test_compute_epsilon_delta_pure_dp).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "paratrain/federated/client.h"
#include "paratrain/federated/rdp_accountant.h"
#include "paratrain/federated/round.h"
#include "paratrain/models/model.h"
#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"

namespace paratrain::federated {
namespace {

TEST(RdpAccountant, MatchesPublishedSampledGaussianValues) {
  const std::vector<std::pair<int64_t, double>> published{{5, 2.18075656e-03}, {50, 2.38460375e-02},
                                                          {100, 1.67416308e02}};
  for (const auto& [order, value] : published)
    EXPECT_NEAR(50 * sampled_gaussian_rdp(0.01, 2.5, order) / value, 1.0, 1e-4) << "order " << order;
  // q = 1 is the Gaussian mechanism, alpha / (2 z^2); q = 0 releases nothing.
  EXPECT_DOUBLE_EQ(sampled_gaussian_rdp(1.0, 2.0, 7), 7.0 / 8.0);
  EXPECT_EQ(sampled_gaussian_rdp(0.0, 2.0, 7), 0.0);
}

TEST(RdpAccountant, ConvertsRdpToEpsilonAsPublished) {
  std::vector<int64_t> orders;
  for (int64_t a = 2; a <= 32; ++a) orders.push_back(a);
  EXPECT_NEAR(epsilon_from_rdp(orders, std::vector<double>(orders.size(), 1.1), 1e-5), 1.32783806176, 1e-9);
}

TEST(RdpAccountant, EpsilonGrowsWithRoundsAndShrinksWithNoise) {
  RdpAccountant a, b, c;
  a.add_rounds(0.1, 1.0, 10);
  b.add_rounds(0.1, 1.0, 100);
  c.add_rounds(0.1, 4.0, 100);
  EXPECT_LT(a.epsilon(1e-5), b.epsilon(1e-5));
  EXPECT_LT(c.epsilon(1e-5), b.epsilon(1e-5));
  EXPECT_GT(c.epsilon(1e-5), 0.0);
}

train::TrainConfig dp_config() {
  train::TrainConfig c;
  c.data.dataset = "synthetic";
  c.data.synthetic_image_size = 4;
  c.data.synthetic_classes = 3;
  c.data.batch_size = 8;
  c.model.kind = "mlp";
  c.model.hidden = {64};
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 1.0;  // large local steps: updates far longer than the clip
  c.optimizer.momentum = 0.0;
  c.federated.clients = 4;
  c.federated.fraction = 1.0;
  c.federated.local_steps = 3;
  c.run.seed = 5;
  return c;
}

// x1 - x0 after one round on 2 ranks.
at::Tensor one_round_change(const train::TrainConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const data::TensorDataset train(at::randn({32, 1, 4, 4}, gen), at::randint(0, 3, {32}, gen, at::kLong));
  torch::manual_seed(1);
  std::vector<std::shared_ptr<models::Model>> models{train::make_model(c), train::make_model(c)};
  const auto x0 = flatten_parameters(*models[0]);
  at::Tensor change;
  testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    FederatedRun run(c, group, models[group.rank()], train);
    run.run_round(1);
    if (group.rank() == 0) change = run.global() - x0;
  });
  return change;
}

TEST(DpFedAvg, ClippingBoundsEachClientsContribution) {
  auto c = dp_config();
  const double unclipped = one_round_change(c).norm().item<double>();
  c.federated.dp_clip = 0.05;
  const double clipped = one_round_change(c).norm().item<double>();
  ASSERT_GT(unclipped, 10 * c.federated.dp_clip);  // the control: without clipping the step is far longer
  // The mean of 4 updates each of norm <= clip has norm <= clip.
  EXPECT_LE(clipped, c.federated.dp_clip * (1 + 1e-5));
  EXPECT_GT(clipped, 0.0);
}

TEST(DpFedAvg, NoiseOnTheMeanHasStdZTimesClipOverM) {
  auto c = dp_config();
  c.federated.dp_clip = 0.05;
  const auto quiet = one_round_change(c);
  c.federated.dp_noise_multiplier = 2.0;
  const auto noise = one_round_change(c) - quiet;
  const double expected = 2.0 * 0.05 / 4;  // z * clip / m
  // ~1300 coordinates: the sample std is within a few percent.
  EXPECT_NEAR(noise.std().item<double>() / expected, 1.0, 0.15);
  EXPECT_NEAR(noise.mean().item<double>() / expected, 0.0, 0.15);
}

}  // namespace
}  // namespace paratrain::federated

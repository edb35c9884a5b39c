// Secure aggregation (Note [Pairwise masks] in federated/secure_aggregation.h):
// - the server's sum equals the plain sum within the fixed-point step, with
//   one client per rank, and every upload the server received passes a
//   uniformity check that the unmasked quantized vector fails (the control);
// - participants that advertised and never uploaded are recovered from the
//   survivors' seeds: the sum is exactly the survivors' sum;
// - whole federated rounds with secure aggregation equal plain aggregation
//   (1e-6, the tolerance of fedavg_oracle_test.cpp), also with simulated
//   dropouts, and differ from the initial model (the rounds did something).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

#include "paratrain/core/error.h"
#include "paratrain/federated/client.h"
#include "paratrain/federated/round.h"
#include "paratrain/federated/secure_aggregation.h"
#include "paratrain/models/model.h"
#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::federated {
namespace {

constexpr int64_t kLength = 4096;
const double kStep = std::ldexp(1.0, -kFractionBits);

// Client c's vector, from its own generator (never torch's global one).
at::Tensor vector_of(int64_t client) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + client);
  return at::randn({kLength}, gen, at::kDouble).mul(3.0);
}

// Each of the 8 bytes of the lanes is spread over its 256 values: a
// chi-square statistic (255 degrees of freedom: mean 255, sd 22.6) under
// 420, 7 sd above the mean, for every byte position. A fixed-point vector
// of small numbers fails on its top bytes (only 0x00 and 0xff), even though
// each of its sign bits alone is set half the time.
bool looks_uniform(const at::Tensor& lanes) {
  const auto* p = reinterpret_cast<const uint64_t*>(lanes.data_ptr<int64_t>());
  const double expected = static_cast<double>(lanes.numel()) / 256.0;
  for (int byte = 0; byte < 8; ++byte) {
    std::vector<int64_t> counts(256, 0);
    for (int64_t i = 0; i < lanes.numel(); ++i) ++counts[(p[i] >> (8 * byte)) & 0xffU];
    double chi2 = 0;
    for (int64_t c : counts) chi2 += (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
    if (chi2 > 420) return false;
  }
  return true;
}

// Rank 0 serves; client c lives on rank 1 + c % (world - 1), as in round.h.
int host(int64_t client, int world) { return 1 + static_cast<int>(client % (world - 1)); }

TEST(SecureAggregation, SumEqualsPlainSumAndEveryUploadLooksUniform) {
  if (!secure_aggregation_available()) GTEST_SKIP() << "built without libsodium";
  constexpr int kWorld = 4;
  const std::vector<int64_t> participants{0, 1, 2};
  at::Tensor plain = torch::zeros({kLength}, torch::kDouble);
  for (int64_t c : participants) plain += vector_of(c);
  at::Tensor got;
  std::vector<at::Tensor> received;
  testing::run_ranks(kWorld, [&](comm::ProcessGroup& g) {
    SecureAggregationRound round(g, 7, participants, [&](int64_t c) { return host(c, kWorld) == g.rank(); },
                                 kLength);
    for (int64_t c : participants) {
      if (host(c, kWorld) == g.rank()) round.add(c, vector_of(c));
    }
    at::Tensor sum = round.aggregate();
    EXPECT_TRUE(round.dropped().empty());
    if (g.rank() == 0) {
      got = sum;
      received = round.received();
    }
  });
  ASSERT_TRUE(got.defined());
  // Each client rounds once (half a step) and the sum is exact mod 2^64.
  EXPECT_LE((got - plain).abs().max().item<double>(), 3 * 0.5 * kStep);
  ASSERT_EQ(received.size(), static_cast<size_t>(kWorld));
  for (int r = 1; r < kWorld; ++r) EXPECT_TRUE(looks_uniform(received[r])) << "the upload of rank " << r;
  // Control: the same vector unmasked is far from uniform.
  EXPECT_FALSE(looks_uniform(to_fixed_point(vector_of(0), 3)));
}

TEST(SecureAggregation, DroppedParticipantsMasksAreRemovedFromTheSum) {
  if (!secure_aggregation_available()) GTEST_SKIP() << "built without libsodium";
  constexpr int kWorld = 3;  // two clients per host rank
  const std::vector<int64_t> participants{0, 1, 2, 3};
  const std::vector<int64_t> failing{1, 2};  // one on each host
  at::Tensor survivors = vector_of(0) + vector_of(3);
  at::Tensor got, unrecovered;
  std::vector<int64_t> dropped;
  testing::run_ranks(kWorld, [&](comm::ProcessGroup& g) {
    SecureAggregationRound round(g, 3, participants, [&](int64_t c) { return host(c, kWorld) == g.rank(); },
                                 kLength);
    for (int64_t c : participants) {
      const bool fails = std::find(failing.begin(), failing.end(), c) != failing.end();
      if (host(c, kWorld) == g.rank() && !fails) round.add(c, vector_of(c));
    }
    at::Tensor sum = round.aggregate();
    if (g.rank() == 0) {
      got = sum;
      dropped = round.dropped();
      // Control: the uploads' plain sum still holds the dropped pairs' masks.
      at::Tensor raw = torch::zeros({kLength}, torch::kLong);
      for (const at::Tensor& r : round.received()) add_mod(raw, r);
      unrecovered = from_fixed_point(raw);
    }
  });
  EXPECT_EQ(dropped, failing);
  EXPECT_LE((got - survivors).abs().max().item<double>(), 2 * 0.5 * kStep);
  EXPECT_GT((unrecovered - survivors).abs().max().item<double>(), 1e6);
}

TEST(SecureAggregation, PairwiseSeedsAgreeAndDifferPerPairAndRound) {
  if (!secure_aggregation_available()) GTEST_SKIP() << "built without libsodium";
  const KeyPair a = make_key_pair(), b = make_key_pair(), c = make_key_pair();
  EXPECT_EQ(pairwise_seed(a, b.public_key, 1), pairwise_seed(b, a.public_key, 1));
  EXPECT_NE(pairwise_seed(a, b.public_key, 1), pairwise_seed(a, b.public_key, 2));
  EXPECT_NE(pairwise_seed(a, b.public_key, 1), pairwise_seed(a, c.public_key, 1));
  // Streams of +seed and -seed cancel exactly.
  at::Tensor t = torch::zeros({kLength}, torch::kLong);
  add_stream(t, pairwise_seed(a, b.public_key, 1), 1);
  EXPECT_TRUE(looks_uniform(t));
  add_stream(t, pairwise_seed(b, a.public_key, 1), -1);
  EXPECT_EQ(t.abs().max().item<int64_t>(), 0);
  // Past one keystream chunk (16384 lanes) the stream goes on; it does not
  // restart (a repeated mask would leak the difference of two elements).
  at::Tensor long_stream = torch::zeros({40000}, torch::kLong);
  add_stream(long_stream, pairwise_seed(a, b.public_key, 1), 1);
  at::Tensor prefix = torch::zeros({kLength}, torch::kLong);
  add_stream(prefix, pairwise_seed(a, b.public_key, 1), 1);
  EXPECT_TRUE(torch::equal(long_stream.slice(0, 0, kLength), prefix));
  EXPECT_FALSE(torch::equal(long_stream.slice(0, 0, 16384), long_stream.slice(0, 16384, 32768)));
  EXPECT_TRUE(looks_uniform(long_stream.slice(0, 16384, 16384 + kLength).contiguous()));
}

TEST(SecureAggregation, QuantizeRoundTripsAndRefusesWhatCouldWrap) {
  const at::Tensor x = torch::tensor({-2.5, 0.0, 1e-9, 123456.789}, torch::kDouble);
  EXPECT_LE((from_fixed_point(to_fixed_point(x, 1)) - x).abs().max().item<double>(), 0.5 * kStep);
  // 2^63 / 2^32 / 4 participants = 2^29: a larger element could wrap the sum.
  try {
    to_fixed_point(torch::tensor({std::ldexp(1.0, 29)}, torch::kDouble), 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fixed-point range"), std::string::npos) << e.what();
  }
  EXPECT_THROW(to_fixed_point(torch::tensor({std::nan("")}, torch::kDouble), 1), Error);
}

// Whole rounds: FederatedRun with and without secure aggregation.
train::TrainConfig round_config(bool secure, double dropout) {
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
  c.federated.clients = 6;
  c.federated.fraction = 1.0;
  c.federated.local_steps = 2;
  c.federated.dropout = dropout;
  c.federated.secure_aggregation = secure;
  c.run.seed = 5;
  return c;
}

at::Tensor global_after_rounds(const train::TrainConfig& c, int ranks, int64_t rounds) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const data::TensorDataset train(at::randn({96, 1, 4, 4}, gen), at::randint(0, 3, {96}, gen, at::kLong));
  std::vector<std::shared_ptr<models::Model>> models;
  for (int r = 0; r < ranks; ++r) models.push_back(testing::seeded(42, [&] { return train::make_model(c); }));
  at::Tensor result;
  testing::run_ranks(ranks, [&](comm::ProcessGroup& g) {
    FederatedRun run(c, g, models[g.rank()], train);
    for (int64_t r = 1; r <= rounds; ++r) run.run_round(r);
    if (g.rank() == 0) result = run.global().clone();
  });
  return result;
}

TEST(SecureAggregation, FederatedRoundsEqualPlainAggregation) {
  if (!secure_aggregation_available()) GTEST_SKIP() << "built without libsodium";
  for (double dropout : {0.0, 0.3}) {
    SCOPED_TRACE(dropout);
    const at::Tensor plain = global_after_rounds(round_config(false, dropout), 3, 3);
    const at::Tensor secure = global_after_rounds(round_config(true, dropout), 3, 3);
    EXPECT_LE((secure - plain).abs().max().item<double>(), 1e-6);
    const at::Tensor initial = testing::seeded(42, [&] {
      auto m = train::make_model(round_config(false, dropout));
      return flatten_parameters(*m);
    });
    EXPECT_GT((plain - initial).abs().max().item<double>(), 1e-3) << "the rounds changed nothing";
  }
}

}  // namespace
}  // namespace paratrain::federated

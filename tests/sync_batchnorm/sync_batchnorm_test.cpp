// SyncBatchNorm against its oracle: torch::nn::BatchNorm1d/2d on the
// concatenated batch of all ranks in one process. Compared: forward output,
// input gradient, weight/bias gradients (summed over ranks, as DDP would),
// running statistics after two batches, and eval output; at 2 and 4 ranks,
// equal and unequal (even empty) per-rank batches. Tolerance: 1e-5 relative
// to the largest oracle value (float32; the global statistics are combined
// in float64, so the difference is a few float32 roundings of reordered
// sums). Negative control: plain BatchNorm per rank misses by far more.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <mutex>
#include <numeric>
#include <optional>

#include "paratrain/data_parallel/sync_batchnorm/sync_batchnorm.h"
#include "tests/support/multi_rank.h"

namespace paratrain::sync_batchnorm {
namespace {

constexpr double kTolerance = 1e-5;

struct Case {
  std::vector<int64_t> sample;  // one sample's shape: {C}, {C, L} or {C, H, W}
  std::vector<int64_t> sizes;   // batch size of each rank
  std::optional<double> momentum = 0.1;
  bool affine = true;
};

// Everything compared, for one rank's slice or for the whole oracle batch.
struct Outputs {
  at::Tensor y, dx, dw, db, running_mean, running_var, num_batches, eval_y;
};

// Global inputs, made once in the main thread (ranks only slice them: the
// global random generator is not for concurrent use).
struct Data {
  at::Tensor x1, x2, r, w, b;
};

Data make_data(const Case& c) {
  torch::manual_seed(11);
  const int64_t n = std::accumulate(c.sizes.begin(), c.sizes.end(), int64_t{0});
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), c.sample.begin(), c.sample.end());
  std::vector<int64_t> per_channel(shape.size(), 1);
  per_channel[1] = c.sample[0];
  // Channel means away from zero and unequal spreads, so that the per-rank
  // statistics differ from the global ones.
  auto input = [&] { return torch::randn(shape) * (1 + torch::rand(per_channel) * 2) + torch::randn(per_channel) * 3; };
  Data d;
  d.x1 = input();
  d.x2 = input();
  d.r = torch::randn(shape);
  d.w = torch::randn({c.sample[0]});
  d.b = torch::randn({c.sample[0]});
  return d;
}

torch::nn::AnyModule make_batchnorm(const Case& c) {
  torch::nn::BatchNormOptions o(c.sample[0]);
  o.momentum(c.momentum ? c10::optional<double>(*c.momentum) : c10::nullopt).affine(c.affine);
  if (c.sample.size() == 3) return torch::nn::AnyModule(torch::nn::BatchNorm2d(o));
  return torch::nn::AnyModule(torch::nn::BatchNorm1d(o));
}

// Train forward + backward on x1 (loss sum(y * r)), train forward on x2,
// eval forward on x1: the same for the oracle and every rank.
Outputs exercise(torch::nn::AnyModule& bn, const Data& d, const Case& c) {
  torch::nn::Module& m = *bn.ptr();
  auto params = m.named_parameters();
  if (c.affine) {
    torch::NoGradGuard no_grad;
    params["weight"].copy_(d.w);
    params["bias"].copy_(d.b);
  }
  Outputs out;
  m.train();
  at::Tensor x = d.x1.clone().requires_grad_(true);
  at::Tensor y = bn.forward(x);
  (y * d.r).sum().backward();
  out.y = y.detach();
  out.dx = x.grad();
  if (c.affine) {
    out.dw = params["weight"].grad();
    out.db = params["bias"].grad();
  }
  bn.forward(d.x2);
  auto buffers = m.named_buffers();
  out.running_mean = buffers["running_mean"].clone();
  out.running_var = buffers["running_var"].clone();
  out.num_batches = buffers["num_batches_tracked"].clone();
  m.eval();
  out.eval_y = bn.forward(d.x1);
  return out;
}

Data slice(const Data& d, int64_t begin, int64_t size) {
  return Data{d.x1.narrow(0, begin, size), d.x2.narrow(0, begin, size), d.r.narrow(0, begin, size), d.w, d.b};
}

// Runs the case on len(sizes) ranks, with SyncBatchNorm (or, for the
// control, plain BatchNorm on each rank's own batch), and puts the results
// together as one batch: per-sample tensors concatenated, weight/bias
// gradients summed, running statistics from rank 0 (checked equal on all).
Outputs run_ranks_case(const Case& c, const Data& d, bool synchronized) {
  const int world = static_cast<int>(c.sizes.size());
  std::vector<Outputs> per_rank(world);
  std::mutex mu;
  testing::run_ranks(world, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    const int64_t begin = std::accumulate(c.sizes.begin(), c.sizes.begin() + rank, int64_t{0});
    torch::nn::AnyModule bn =
        synchronized ? torch::nn::AnyModule(SyncBatchNorm(
                           SyncBatchNormOptions{.num_features = c.sample[0], .momentum = c.momentum, .affine = c.affine},
                           group))
                     : make_batchnorm(c);
    Outputs out = exercise(bn, slice(d, begin, c.sizes[rank]), c);
    std::lock_guard lock(mu);
    per_rank[rank] = std::move(out);
  });
  Outputs all;
  auto cat = [&](at::Tensor Outputs::*field) {
    std::vector<at::Tensor> parts;
    for (const Outputs& o : per_rank) parts.push_back(o.*field);
    return torch::cat(parts);
  };
  all.y = cat(&Outputs::y);
  all.dx = cat(&Outputs::dx);
  all.eval_y = cat(&Outputs::eval_y);
  if (c.affine) {
    all.dw = torch::zeros_like(per_rank[0].dw);
    all.db = torch::zeros_like(per_rank[0].db);
    for (const Outputs& o : per_rank) all.dw += o.dw, all.db += o.db;
  }
  all.running_mean = per_rank[0].running_mean;
  all.running_var = per_rank[0].running_var;
  all.num_batches = per_rank[0].num_batches;
  if (synchronized) {
    for (int r = 1; r < world; ++r) {
      EXPECT_TRUE(torch::equal(per_rank[r].running_mean, all.running_mean)) << "rank " << r;
      EXPECT_TRUE(torch::equal(per_rank[r].running_var, all.running_var)) << "rank " << r;
    }
  }
  return all;
}

double rel(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item<double>();
}

// The largest relative difference over everything compared, printed per field.
double max_diff(const Outputs& got, const Outputs& want, bool affine) {
  std::vector<std::pair<const char*, double>> diffs = {
      {"y", rel(got.y, want.y)},
      {"dx", rel(got.dx, want.dx)},
      {"running_mean", rel(got.running_mean, want.running_mean)},
      {"running_var", rel(got.running_var, want.running_var)},
      {"eval_y", rel(got.eval_y, want.eval_y)}};
  if (affine) {
    diffs.emplace_back("dw", rel(got.dw, want.dw));
    diffs.emplace_back("db", rel(got.db, want.db));
  }
  double worst = 0;
  for (const auto& [name, diff] : diffs) {
    ::testing::Test::RecordProperty(name, std::to_string(diff));
    std::printf("  %-13s max relative diff %.3g\n", name, diff);
    worst = std::max(worst, diff);
  }
  EXPECT_TRUE(torch::equal(got.num_batches, want.num_batches));
  return worst;
}

void expect_matches_oracle(const Case& c) {
  const Data d = make_data(c);
  torch::nn::AnyModule oracle_bn = make_batchnorm(c);
  const Outputs oracle = exercise(oracle_bn, d, c);
  const Outputs sync = run_ranks_case(c, d, /*synchronized=*/true);
  EXPECT_LE(max_diff(sync, oracle, c.affine), kTolerance);
}

TEST(SyncBatchNorm, MatchesBatchNorm2dTwoRanksEqualBatches) { expect_matches_oracle({.sample = {3, 4, 4}, .sizes = {4, 4}}); }

TEST(SyncBatchNorm, MatchesBatchNorm2dTwoRanksUnequalBatches) { expect_matches_oracle({.sample = {3, 4, 4}, .sizes = {2, 5}}); }

TEST(SyncBatchNorm, MatchesBatchNorm2dFourRanksUnequalBatches) {
  expect_matches_oracle({.sample = {4, 3, 5}, .sizes = {3, 1, 2, 4}});
}

// A rank with no samples still joins both collectives and contributes nothing.
TEST(SyncBatchNorm, MatchesBatchNorm2dWithAnEmptyRank) { expect_matches_oracle({.sample = {3, 4, 4}, .sizes = {3, 0, 2, 4}}); }

TEST(SyncBatchNorm, MatchesBatchNorm1dOnNC) { expect_matches_oracle({.sample = {5}, .sizes = {3, 6}}); }

TEST(SyncBatchNorm, MatchesBatchNorm1dOnNCL) { expect_matches_oracle({.sample = {3, 7}, .sizes = {2, 1, 3, 2}}); }

TEST(SyncBatchNorm, CumulativeAverageWithoutMomentum) {
  expect_matches_oracle({.sample = {3, 4, 4}, .sizes = {2, 5}, .momentum = std::nullopt});
}

TEST(SyncBatchNorm, WithoutAffine) { expect_matches_oracle({.sample = {3, 4, 4}, .sizes = {4, 3}, .affine = false}); }

// Negative control: plain BatchNorm on each rank's own batch (what DDP alone
// gives) misses the oracle by orders of magnitude more than the tolerance, so
// the tests above can fail.
TEST(SyncBatchNorm, PlainBatchNormPerRankDiffersFromConcatenatedBatch) {
  const Case c{.sample = {3, 4, 4}, .sizes = {2, 5}};
  const Data d = make_data(c);
  torch::nn::AnyModule oracle_bn = make_batchnorm(c);
  const Outputs oracle = exercise(oracle_bn, d, c);
  const Outputs plain = run_ranks_case(c, d, /*synchronized=*/false);
  std::printf("  control: y %.3g, dx %.3g, running_var %.3g\n", rel(plain.y, oracle.y), rel(plain.dx, oracle.dx),
              rel(plain.running_var, oracle.running_var));
  EXPECT_GT(rel(plain.y, oracle.y), 1000 * kTolerance);
  EXPECT_GT(rel(plain.dx, oracle.dx), 1000 * kTolerance);
  EXPECT_GT(rel(plain.running_var, oracle.running_var), 1000 * kTolerance);
}

// Parameter and buffer names are BatchNorm2d's, so state dicts interchange.
TEST(SyncBatchNorm, NamesMatchBatchNorm2d) {
  testing::run_ranks(1, [](comm::ProcessGroup& group) {
    for (bool affine : {true, false}) {
      torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(4).affine(affine));
      SyncBatchNorm sync(SyncBatchNormOptions{.num_features = 4, .affine = affine}, group);
      EXPECT_EQ(sync->named_parameters().keys(), bn->named_parameters().keys());
      EXPECT_EQ(sync->named_buffers().keys(), bn->named_buffers().keys());
      auto copy = std::dynamic_pointer_cast<SyncBatchNormImpl>(sync->clone());
      ASSERT_TRUE(copy);
      EXPECT_EQ(&copy->group(), &group);
    }
  });
}

}  // namespace
}  // namespace paratrain::sync_batchnorm

// Pipeline partitioning (partition.h): the balanced split is the exact
// min-max optimum (checked against brute force), never worse than an even
// split by layer count, deterministic; user splits and impossible requests
// fail with errors naming the config keys; the time probe runs each layer as
// a pipeline step does (no input gradient for layer 0, the loss on the last).
#include <gtest/gtest.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/pipeline/stage.h"

namespace paratrain::pipeline {
namespace {

double sum_of_squares(const std::vector<double>& costs, const std::vector<int>& bounds) {
  double sum = 0;
  for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
    double c = 0;
    for (int i = bounds[j]; i < bounds[j + 1]; ++i) c += costs[i];
    sum += c * c;
  }
  return sum;
}

// Over every way to cut `costs` into `chunks` non-empty contiguous pieces: the
// smallest largest-chunk cost, and the smallest sum of squared chunk costs
// among the cuts reaching it (the documented tie-break), by enumeration.
struct Optimum {
  double max_cost = 1e300;
  double squares = 1e300;
};
Optimum brute_force_optimum(const std::vector<double>& costs, int chunks) {
  const int n = static_cast<int>(costs.size());
  Optimum best;
  std::vector<int> bounds{0};
  std::function<void(int, int)> cut = [&](int begin, int left) {
    if (left == 1) {
      bounds.push_back(n);
      const double worst = max_chunk_cost(costs, bounds), squares = sum_of_squares(costs, bounds);
      if (worst < best.max_cost || (worst == best.max_cost && squares < best.squares)) best = {worst, squares};
      bounds.pop_back();
      return;
    }
    for (int j = begin + 1; j + left - 1 <= n; ++j) {
      bounds.push_back(j);
      cut(j, left - 1);
      bounds.pop_back();
    }
  };
  cut(0, chunks);
  return best;
}

void expect_valid_bounds(const std::vector<int>& bounds, int layers, int chunks) {
  ASSERT_EQ(static_cast<int>(bounds.size()), chunks + 1);
  EXPECT_EQ(bounds.front(), 0);
  EXPECT_EQ(bounds.back(), layers);
  for (int j = 0; j < chunks; ++j) EXPECT_LT(bounds[j], bounds[j + 1]) << "chunk " << j << " is empty";
}

TEST(Partition, ExactOptimumAgainstBruteForce) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> cost(1, 20);  // integers: sums are exact
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + trial % 9;
    std::vector<double> costs(n);
    for (double& c : costs) c = cost(rng);
    for (int chunks = 1; chunks <= n; ++chunks) {
      const std::vector<int> bounds = balanced_partition(costs, chunks);
      expect_valid_bounds(bounds, n, chunks);
      const Optimum optimum = brute_force_optimum(costs, chunks);
      EXPECT_EQ(max_chunk_cost(costs, bounds), optimum.max_cost) << "trial " << trial << " chunks " << chunks;
      EXPECT_EQ(sum_of_squares(costs, bounds), optimum.squares) << "trial " << trial << " chunks " << chunks;
    }
  }
}

// An even split by layer count (what one would do without costs), as bounds.
std::vector<int> even_split(int layers, int chunks) {
  std::vector<int64_t> sizes(chunks, layers / chunks);
  for (int j = 0; j < layers % chunks; ++j) ++sizes[j];
  return explicit_partition(sizes, layers, chunks);
}

TEST(Partition, BalancedBeatsEvenSplitOnSkewedCosts) {
  // A transformer-like stack: a heavy embedding and head around cheap blocks.
  const std::vector<double> costs = {8, 1, 1, 1, 1, 1, 1, 1, 1, 8};
  for (int chunks : {2, 3, 4}) {
    const double balanced = max_chunk_cost(costs, balanced_partition(costs, chunks));
    const double even = max_chunk_cost(costs, even_split(10, chunks));
    EXPECT_LE(balanced, even) << chunks << " chunks";
  }
  // Strictly better where it matters: the even split [3, 3, 2, 2] puts
  // 8 + 1 + 1 = 10 on chunk 0; the optimum [8] [1 x 4] [1 x 4] [8] costs 8.
  EXPECT_EQ(max_chunk_cost(costs, even_split(10, 4)), 10.0);
  EXPECT_EQ(balanced_partition(costs, 4), (std::vector<int>{0, 1, 5, 9, 10}));
}

TEST(Partition, DeterministicTieBreakGivesEarlyChunksMoreLayers) {
  const std::vector<double> uniform(10, 1.0);
  EXPECT_EQ(balanced_partition(uniform, 4), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(balanced_partition(uniform, 1), (std::vector<int>{0, 10}));
  EXPECT_EQ(balanced_partition(uniform, 10), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  const std::vector<double> costs = {3, 1, 4, 1, 5, 9, 2, 6};
  EXPECT_EQ(balanced_partition(costs, 3), balanced_partition(costs, 3));
  // Zero-cost layers still each land in a chunk of at least one layer.
  expect_valid_bounds(balanced_partition({0, 0, 0, 5}, 4), 4, 4);
}

TEST(Partition, Errors) {
  try {
    balanced_partition({1, 1, 1}, 4);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.pp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pipeline.virtual_stages"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 layers"), std::string::npos) << msg;
  }
  EXPECT_THROW(balanced_partition({1, 1}, 0), ConfigError);
  EXPECT_THROW(balanced_partition({1, -1}, 1), c10::Error);

  EXPECT_EQ(explicit_partition({5, 3}, 8, 2), (std::vector<int>{0, 5, 8}));
  auto message = [](const std::vector<int64_t>& split, int layers, int chunks) -> std::string {
    try {
      explicit_partition(split, layers, chunks);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  std::string msg = message({5, 3}, 8, 4);
  EXPECT_NE(msg.find("pipeline.split = [5, 3] has 2 entries"), std::string::npos) << msg;
  msg = message({8, 0}, 8, 2);
  EXPECT_NE(msg.find("pipeline.split"), std::string::npos) << msg;
  EXPECT_NE(msg.find("entry 1 is 0"), std::string::npos) << msg;
  msg = message({5, 4}, 8, 2);
  EXPECT_NE(msg.find("pipeline.split = [5, 4] covers 9 layers but the model has 8 layers"), std::string::npos) << msg;
  msg = message({2, 3}, 8, 2);
  EXPECT_NE(msg.find("covers 5 layers but the model has 8 layers"), std::string::npos) << msg;
}

// What balancing by time measures: the step's own work per layer. Layer 0
// runs on data that needs no gradient; the last layer's time includes the
// loss and its backward; nothing it ran leaves a gradient behind.
TEST(MeasureLayerTimes, TimesEachLayerAsAStepRunsIt) {
  std::vector<models::Layer> layers;
  std::vector<std::vector<bool>> input_needs_grad(3);
  for (int i = 0; i < 3; ++i) {
    auto linear = torch::nn::Linear(6, 6);
    layers.push_back({"fc" + std::to_string(i), {{"fc" + std::to_string(i), linear.ptr()}},
                      [linear, &seen = input_needs_grad[i]](const at::Tensor& x) mutable {
                        seen.push_back(x.requires_grad());
                        return linear->forward(x);
                      }});
  }
  const BoundaryShapes shapes = infer_boundary_shapes(layers, {6});
  for (auto& seen : input_needs_grad) seen.clear();  // the shape probe ran under no_grad
  int losses = 0;
  std::vector<int64_t> loss_input_shape;
  const auto times = measure_layer_times(layers, shapes, /*rows=*/4, [&](const at::Tensor& out) {
    ++losses;
    loss_input_shape = out.sizes().vec();
    return out.pow(2).mean();
  }, /*repeats=*/2);
  ASSERT_EQ(times.size(), 3u);
  for (double t : times) EXPECT_GT(t, 0.0);
  // One unmeasured run, then two measured ones, per layer.
  EXPECT_EQ(input_needs_grad[0], (std::vector<bool>{false, false, false}));
  EXPECT_EQ(input_needs_grad[1], (std::vector<bool>{true, true, true}));
  EXPECT_EQ(input_needs_grad[2], (std::vector<bool>{true, true, true}));
  EXPECT_EQ(losses, 3);  // the last layer only
  EXPECT_EQ(loss_input_shape, (std::vector<int64_t>{4, 6}));
  for (const auto& layer : layers) {
    for (const auto& p : layer.modules.front().second->parameters()) EXPECT_FALSE(p.grad().defined());
  }
}

}  // namespace
}  // namespace paratrain::pipeline

// Layer-to-chunk partitioning for pipelines (see partition.h): an exact
// min-max dynamic program and the checks for a user-given split.
#include "paratrain/pipeline/partition.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "paratrain/core/error.h"

namespace paratrain::pipeline {

namespace {

// Sum of layers [begin, end) from prefix sums. Every cost compared below goes
// through this one function, so equal partitions compare bit-equal and the
// tie-break is deterministic.
double range_cost(const std::vector<double>& prefix, int begin, int end) { return prefix[end] - prefix[begin]; }

}  // namespace

namespace {

using Table = std::vector<std::vector<double>>;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The cost of layers [begin, end) as the first of k remaining chunks, i.e.
// as chunk chunks - k (scaled by its stage's scale when there are scales).
struct ChunkCost {
  const std::vector<double>& prefix;
  const std::vector<double>& scale;
  int chunks;
  double operator()(int k, int begin, int end) const {
    const double c = range_cost(prefix, begin, end);
    return scale.empty() ? c : c * scale[static_cast<size_t>(chunks - k)];
  }
};

// best[k][i]: the smallest possible largest-chunk cost when layers [i, n)
// are split into k chunks of at least one layer (infinity if impossible).
Table min_max_table(const ChunkCost& cost, int n) {
  Table best(cost.chunks + 1, std::vector<double>(n + 1, kInf));
  for (int i = 0; i < n; ++i) best[1][i] = cost(1, i, n);
  for (int k = 2; k <= cost.chunks; ++k) {
    for (int i = 0; i + k <= n; ++i) {
      for (int j = i + 1; j + k - 1 <= n; ++j) best[k][i] = std::min(best[k][i], std::max(cost(k, i, j), best[k - 1][j]));
    }
  }
  return best;
}

// Among the partitions whose chunks all cost <= `limit` (the optimum), the
// one with the smallest sum of squared chunk costs: the min-max alone leaves
// the other chunks arbitrary ([8] [1 x 7] [1] [8] is as good as
// [8] [1 x 4] [1 x 4] [8]); the squares prefer the even one. Ties go to the
// split giving the earlier chunk more layers.
// squares[k][i]: that sum over layers [i, n) cut into k chunks; cut[k][i]:
// where the first of those chunks ends. Recording the choice (rather than
// re-deriving it by comparing sums later) keeps float ties out of it.
std::vector<int> even_cut_within(const ChunkCost& cost, int n, double limit) {
  const int chunks = cost.chunks;
  Table squares(chunks + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(chunks + 1, std::vector<int>(n + 1, -1));
  const auto square = [&](int k, int begin, int end) {
    const double c = cost(k, begin, end);
    return c <= limit ? c * c : kInf;
  };
  for (int i = 0; i < n; ++i) {
    squares[1][i] = square(1, i, n);
    cut[1][i] = n;
  }
  for (int k = 2; k <= chunks; ++k) {
    for (int i = 0; i + k <= n; ++i) {
      for (int j = i + 1; j + k - 1 <= n; ++j) {
        const double candidate = square(k, i, j) + squares[k - 1][j];
        if (candidate <= squares[k][i]) {  // <=: a tie goes to the later cut
          squares[k][i] = candidate;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> bounds{0};
  for (int k = chunks; k > 1; --k) {
    const int next = cut[k][bounds.back()];
    TORCH_CHECK(next > bounds.back(), "balanced_partition: no split within the optimum (a bug)");
    bounds.push_back(next);
  }
  bounds.push_back(n);
  return bounds;
}

}  // namespace

std::vector<int> balanced_partition(const std::vector<double>& layer_costs, int chunks,
                                    const std::vector<double>& chunk_scale) {
  const int n = static_cast<int>(layer_costs.size());
  if (chunks < 1 || chunks > n) {
    throw ConfigError(fmt::format(
        "pipeline partition: {} model chunks (parallel.pp x pipeline.virtual_stages) for a model of {} layers; "
        "every chunk needs at least one layer, so use at most {} chunks",
        chunks, n, n));
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    TORCH_CHECK(std::isfinite(layer_costs[i]) && layer_costs[i] >= 0, "balanced_partition: layer ", i, " has cost ",
                layer_costs[i], "; costs must be finite and >= 0");
    prefix[i + 1] = prefix[i] + layer_costs[i];
  }
  TORCH_CHECK(chunk_scale.empty() || static_cast<int>(chunk_scale.size()) == chunks, "balanced_partition: ",
              chunk_scale.size(), " chunk scales for ", chunks, " chunks");
  for (double s : chunk_scale)
    TORCH_CHECK(std::isfinite(s) && s > 0, "balanced_partition: a chunk scale is ", s, "; scales must be > 0");
  const ChunkCost cost{prefix, chunk_scale, chunks};
  return even_cut_within(cost, n, min_max_table(cost, n)[chunks][0]);
}

std::vector<int> explicit_partition(const std::vector<int64_t>& layers_per_chunk, int num_layers, int chunks) {
  const auto shown = fmt::format("[{}]", fmt::join(layers_per_chunk, ", "));
  if (static_cast<int>(layers_per_chunk.size()) != chunks) {
    throw ConfigError(fmt::format(
        "pipeline.split = {} has {} entries but the pipeline has {} model chunks (parallel.pp x "
        "pipeline.virtual_stages); give one layer count per chunk",
        shown, layers_per_chunk.size(), chunks));
  }
  std::vector<int> bounds{0};
  int64_t sum = 0;
  for (std::size_t j = 0; j < layers_per_chunk.size(); ++j) {
    if (layers_per_chunk[j] < 1) {
      throw ConfigError(fmt::format("pipeline.split = {}: entry {} is {}; every chunk needs at least one layer",
                                    shown, j, layers_per_chunk[j]));
    }
    sum += layers_per_chunk[j];
    if (sum > num_layers) break;  // reported below with the full sum
    bounds.push_back(static_cast<int>(sum));
  }
  if (sum != num_layers) {
    int64_t total = 0;
    for (int64_t l : layers_per_chunk) total += l;
    throw ConfigError(fmt::format("pipeline.split = {} covers {} layers but the model has {} layers", shown, total,
                                  num_layers));
  }
  return bounds;
}

double max_chunk_cost(const std::vector<double>& layer_costs, const std::vector<int>& bounds) {
  TORCH_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == static_cast<int>(layer_costs.size()),
              "max_chunk_cost: bounds must run from 0 to the layer count ", layer_costs.size());
  double worst = 0;
  for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
    TORCH_CHECK(bounds[j] <= bounds[j + 1], "max_chunk_cost: bounds decrease at chunk ", j);
    double cost = 0;
    for (int i = bounds[j]; i < bounds[j + 1]; ++i) cost += layer_costs[i];
    worst = std::max(worst, cost);
  }
  return worst;
}

}  // namespace paratrain::pipeline

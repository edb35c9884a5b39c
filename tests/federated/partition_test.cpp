// Client partitions: every row is assigned exactly once (all three kinds),
// Dirichlet(alpha) approaches IID as alpha grows and is skewed when it is
// small (the negative control: the IID bound fails there), McMahan's shards
// give each client few labels, and client sampling is seeded and uniform
// in size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "paratrain/core/error.h"
#include "paratrain/federated/partition.h"
#include "paratrain/federated/sampling.h"

namespace paratrain::federated {
namespace {

// 10 classes, 200 rows each, interleaved (row i has label i % 10).
std::vector<int64_t> balanced_labels(int64_t per_class = 200, int64_t classes = 10) {
  std::vector<int64_t> labels(per_class * classes);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i) % classes;
  return labels;
}

void expect_each_row_once(const Partition& p, int64_t rows) {
  std::vector<int> seen(rows, 0);
  for (const auto& client : p)
    for (int64_t r : client) ++seen.at(r);
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

// The largest gap, over clients and classes, between a client's share of a
// class and the global share (0.1 here): 0 for a perfectly IID split.
double max_label_skew(const std::vector<int64_t>& labels, const Partition& p) {
  const auto hist = label_histograms(labels, p, 10);
  double worst = 0;
  for (size_t c = 0; c < p.size(); ++c)
    for (int64_t k = 0; k < 10; ++k)
      worst = std::max(worst, std::abs(static_cast<double>(hist[c][k]) / p[c].size() - 0.1));
  return worst;
}

TEST(Partition, EveryRowIsAssignedExactlyOnce) {
  const auto labels = balanced_labels();
  for (auto kind : {PartitionKind::kIid, PartitionKind::kDirichlet, PartitionKind::kShards}) {
    PartitionOptions o;
    o.kind = kind;
    o.clients = 20;
    o.alpha = 0.3;
    o.seed = 7;
    const auto p = make_partition(labels, o);
    ASSERT_EQ(p.size(), 20u);
    expect_each_row_once(p, static_cast<int64_t>(labels.size()));
    for (const auto& client : p) EXPECT_FALSE(client.empty());
  }
}

TEST(Partition, IidSizesDifferByAtMostOne) {
  PartitionOptions o;
  o.clients = 7;
  const auto p = make_partition(balanced_labels(), o);
  size_t lo = SIZE_MAX, hi = 0;
  for (const auto& c : p) lo = std::min(lo, c.size()), hi = std::max(hi, c.size());
  EXPECT_LE(hi - lo, 1u);
}

// Each client holds 200 rows on average; with alpha = 1e4 its label shares
// are within a few binomial standard deviations (sqrt(0.09 / 200) ~ 0.02) of
// 0.1. alpha = 0.1 (the control) gives clients one or two dominant labels.
TEST(Partition, DirichletApproachesIidAsAlphaGrows) {
  const auto labels = balanced_labels();
  PartitionOptions o;
  o.kind = PartitionKind::kDirichlet;
  o.clients = 10;
  o.seed = 3;
  o.alpha = 1e4;
  const double near_iid = max_label_skew(labels, make_partition(labels, o));
  o.alpha = 0.1;
  const double skewed = max_label_skew(labels, make_partition(labels, o));
  EXPECT_LT(near_iid, 0.1);
  EXPECT_GT(skewed, 0.3);
  // And the IID split sits in the same band as alpha = 1e4.
  o.kind = PartitionKind::kIid;
  EXPECT_LT(max_label_skew(labels, make_partition(labels, o)), 0.1);
}

TEST(Partition, ShardsGiveEachClientAtMostTwoLabelsWhenShardsAreSingleLabel) {
  // 2000 rows, 10 classes, 20 clients x 2 shards of 50 rows: a label's 200
  // rows are exactly 4 shards, so a shard never straddles two labels.
  const auto labels = balanced_labels();
  PartitionOptions o;
  o.kind = PartitionKind::kShards;
  o.clients = 20;
  o.seed = 1;
  const auto hist = label_histograms(labels, make_partition(labels, o), 10);
  for (const auto& h : hist) EXPECT_LE(std::count_if(h.begin(), h.end(), [](int64_t n) { return n > 0; }), 2);
}

TEST(Partition, SeedMakesItReproducibleAndTooManyClientsIsAConfigError) {
  const auto labels = balanced_labels(2);
  PartitionOptions o;
  o.kind = PartitionKind::kDirichlet;
  o.clients = 4;
  o.alpha = 5;
  o.seed = 11;
  EXPECT_EQ(make_partition(labels, o), make_partition(labels, o));
  o.clients = 21;
  EXPECT_THROW(make_partition(labels, o), ConfigError);
  EXPECT_THROW(parse_partition_kind("random"), ConfigError);
}

TEST(Sampling, FractionOfDistinctClientsSeededPerRound) {
  const auto a = sample_clients(100, 0.1, 5, 1);
  ASSERT_EQ(a.size(), 10u);
  EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), 10u);
  EXPECT_EQ(a, sample_clients(100, 0.1, 5, 1));
  EXPECT_NE(a, sample_clients(100, 0.1, 5, 2));
  EXPECT_NE(a, sample_clients(100, 0.1, 6, 1));
  EXPECT_EQ(sample_clients(100, 1e-9, 5, 1).size(), 1u);
  EXPECT_EQ(sample_clients(7, 1.0, 5, 1), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  // Over many rounds every client is picked about equally often.
  std::vector<int> picks(20, 0);
  for (int r = 0; r < 2000; ++r)
    for (int64_t c : sample_clients(20, 0.25, 9, r)) ++picks[c];
  for (int n : picks) EXPECT_NEAR(n, 500, 100);
}

TEST(Sampling, DropoutProbabilityIsHonoured) {
  int dropped = 0;
  for (int c = 0; c < 10000; ++c) dropped += client_drops(0.3, 1, 4, c) ? 1 : 0;
  EXPECT_NEAR(dropped, 3000, 200);
  EXPECT_FALSE(client_drops(0.0, 1, 4, 0));
  EXPECT_TRUE(client_drops(1.0, 1, 4, 0));
}

}  // namespace
}  // namespace paratrain::federated

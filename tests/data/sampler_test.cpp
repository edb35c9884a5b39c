// DistributedSampler: exact agreement with PyTorch's DistributedSampler
// (fixtures printed by torch 1.13.1's Python), and properties over random
// (N, replicas, batch, seed, epoch, drop_last): ranks partition the epoch,
// and each step's per-rank batches together are the one-process batch.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <vector>

#include "paratrain/data/sampler.h"

namespace paratrain::data {
namespace {

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::vector<std::vector<int64_t>> all_ranks(int64_t n, SamplerOptions o, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < o.num_replicas; ++r) {
    o.rank = r;
    DistributedSampler s(n, o);
    s.set_epoch(epoch);
    out.push_back(to_vector(s.indices()));
  }
  return out;
}

SamplerOptions opts(int64_t replicas, bool shuffle, uint64_t seed, bool drop_last) {
  SamplerOptions o;
  o.num_replicas = replicas;
  o.shuffle = shuffle;
  o.seed = seed;
  o.drop_last = drop_last;
  return o;
}

using Ranks = std::vector<std::vector<int64_t>>;

// for n, R, shuffle, seed, epoch, drop_last: [list(DistributedSampler(...)) for rank]
TEST(DistributedSampler, MatchesPyTorch) {
  EXPECT_EQ(all_ranks(10, opts(3, true, 7, false), 0), (Ranks{{5, 4, 9, 2}, {0, 1, 6, 5}, {3, 7, 8, 0}}));
  EXPECT_EQ(all_ranks(10, opts(3, true, 7, false), 1), (Ranks{{3, 1, 4, 9}, {5, 2, 7, 3}, {0, 6, 8, 5}}));
  EXPECT_EQ(all_ranks(10, opts(3, true, 7, true), 0), (Ranks{{5, 4, 9}, {0, 1, 6}, {3, 7, 8}}));
  EXPECT_EQ(all_ranks(5, opts(4, false, 0, false), 0), (Ranks{{0, 4}, {1, 0}, {2, 1}, {3, 2}}));
  EXPECT_EQ(all_ranks(3, opts(4, true, 1, false), 2), (Ranks{{1}, {0}, {2}, {1}}));
  EXPECT_EQ(all_ranks(23, opts(2, true, 123, false), 5),
            (Ranks{{1, 7, 17, 12, 10, 0, 15, 22, 18, 19, 5, 8}, {20, 21, 9, 11, 6, 16, 13, 14, 4, 3, 2, 1}}));
  // n = 1001 over 4 ranks, seed 42, epoch 3: first six and last two of each rank.
  const Ranks big = all_ranks(1001, opts(4, true, 42, false), 3);
  const Ranks head = {{579, 280, 997, 309, 373, 327}, {47, 36, 557, 30, 887, 681},
                      {252, 283, 20, 436, 637, 932}, {755, 10, 977, 682, 76, 439}};
  const Ranks tail = {{625, 297}, {386, 579}, {430, 47}, {750, 252}};
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(big[r].size(), 251u);
    EXPECT_EQ(std::vector<int64_t>(big[r].begin(), big[r].begin() + 6), head[r]);
    EXPECT_EQ(std::vector<int64_t>(big[r].end() - 2, big[r].end()), tail[r]);
  }
}

TEST(DistributedSampler, SizesFollowPaddingRules) {
  DistributedSampler pad(10, opts(4, true, 0, false));
  EXPECT_EQ(pad.num_samples(), 3);
  EXPECT_EQ(pad.total_size(), 12);
  DistributedSampler drop(10, opts(4, true, 0, true));
  EXPECT_EQ(drop.num_samples(), 2);
  EXPECT_EQ(drop.total_size(), 8);
  DistributedSampler tiny(2, opts(4, true, 0, true));
  EXPECT_EQ(tiny.num_samples(), 0);
  EXPECT_EQ(tiny.indices().numel(), 0);
}

TEST(DistributedSampler, RejectsBadOptions) {
  SamplerOptions o = opts(2, true, 0, false);
  o.rank = 2;
  EXPECT_THROW(DistributedSampler(10, o), c10::Error);
  o.rank = -1;
  EXPECT_THROW(DistributedSampler(10, o), c10::Error);
  EXPECT_THROW(DistributedSampler(10, opts(0, true, 0, false)), c10::Error);
  EXPECT_THROW(DistributedSampler(0, opts(2, true, 0, false)), c10::Error);
  DistributedSampler s(10, opts(1, true, 0, false));
  EXPECT_THROW(s.set_epoch(-1), c10::Error);
}

TEST(DistributedSampler, DoesNotTouchTheGlobalGenerator) {
  torch::manual_seed(11);
  const at::Tensor expected = torch::rand({4});
  torch::manual_seed(11);
  DistributedSampler s(1000, opts(2, true, 3, false));
  s.set_epoch(4);
  s.indices();
  EXPECT_TRUE(torch::rand({4}).equal(expected));
}

struct Case {
  int64_t n, replicas, batch;
  uint64_t seed;
  int64_t epoch;
  bool shuffle, drop_last;
};

Case gen_case() {
  Case c;
  c.n = *rc::gen::inRange<int64_t>(1, 300);
  c.replicas = *rc::gen::inRange<int64_t>(1, 9);
  c.batch = *rc::gen::inRange<int64_t>(1, 12);
  c.seed = *rc::gen::arbitrary<uint32_t>();
  c.epoch = *rc::gen::inRange<int64_t>(0, 1000);
  c.shuffle = *rc::gen::weightedElement<bool>({{4, true}, {1, false}});
  c.drop_last = *rc::gen::arbitrary<bool>();
  return c;
}

RC_GTEST_PROP(DistributedSampler, RanksPartitionTheEpoch, ()) {
  const Case c = gen_case();
  const Ranks ranks = all_ranks(c.n, opts(c.replicas, c.shuffle, c.seed, c.drop_last), c.epoch);
  const int64_t per_rank = c.drop_last ? c.n / c.replicas : (c.n + c.replicas - 1) / c.replicas;
  std::vector<int64_t> all;
  for (const auto& r : ranks) {
    RC_ASSERT(int64_t(r.size()) == per_rank);
    all.insert(all.end(), r.begin(), r.end());
  }
  for (int64_t i : all) RC_ASSERT(i >= 0 && i < c.n);
  const std::set<int64_t> distinct(all.begin(), all.end());
  if (c.drop_last || c.n % c.replicas == 0) {
    // No padding: disjoint ranks; without drop_last they cover everything.
    RC_ASSERT(distinct.size() == all.size());
    if (!c.drop_last) RC_ASSERT(int64_t(distinct.size()) == c.n);
  } else {
    // Padding: everything is covered, and only replicas - n % replicas
    // entries are repeats.
    RC_ASSERT(int64_t(distinct.size()) == c.n);
    RC_ASSERT(int64_t(all.size()) - c.n == c.replicas - c.n % c.replicas);
  }
}

// Note [Strided split] in sampler.cpp: rank batches of B make, step by step,
// the one-process batches of B * replicas (outside the padded tail).
RC_GTEST_PROP(DistributedSampler, UnionOfRankBatchesIsTheSingleProcessBatch, ()) {
  const Case c = gen_case();
  const Ranks ranks = all_ranks(c.n, opts(c.replicas, c.shuffle, c.seed, c.drop_last), c.epoch);
  const std::vector<int64_t> single = all_ranks(c.n, opts(1, c.shuffle, c.seed, c.drop_last), c.epoch)[0];
  RC_ASSERT(int64_t(single.size()) == c.n);
  const int64_t global = c.batch * c.replicas;
  const int64_t total = int64_t(ranks[0].size()) * c.replicas;
  for (int64_t b = 0; (b + 1) * global <= std::min(total, c.n); ++b) {
    std::vector<int64_t> joined;
    for (const auto& r : ranks) joined.insert(joined.end(), r.begin() + b * c.batch, r.begin() + (b + 1) * c.batch);
    std::vector<int64_t> want(single.begin() + b * global, single.begin() + (b + 1) * global);
    std::sort(joined.begin(), joined.end());
    std::sort(want.begin(), want.end());
    RC_ASSERT(joined == want);
  }
}

RC_GTEST_PROP(DistributedSampler, EpochDeterminesTheOrder, ()) {
  Case c = gen_case();
  c.n = *rc::gen::inRange<int64_t>(12, 300);  // 12! orders: a repeat is not a real risk
  const SamplerOptions o = opts(c.replicas, true, c.seed, c.drop_last);
  const Ranks first = all_ranks(c.n, o, c.epoch);
  RC_ASSERT(all_ranks(c.n, o, c.epoch) == first);  // same epoch, same order
  const Ranks next = all_ranks(c.n, o, c.epoch + 1);
  RC_ASSERT(next != first);
  // A sampler reused across epochs gives what fresh ones give.
  SamplerOptions r0 = o;
  r0.rank = 0;
  DistributedSampler s(c.n, r0);
  s.set_epoch(c.epoch + 1);
  s.set_epoch(c.epoch);
  RC_ASSERT(to_vector(s.indices()) == first[0]);
}

TEST(DistributedSampler, WithoutShuffleRanksStride) {
  const Ranks ranks = all_ranks(7, opts(3, false, 0, false), 9);
  EXPECT_EQ(ranks, (Ranks{{0, 3, 6}, {1, 4, 0}, {2, 5, 1}}));
}

}  // namespace
}  // namespace paratrain::data

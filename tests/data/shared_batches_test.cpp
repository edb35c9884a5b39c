// Unequal shares of every global batch (data.batch_shares; Note [Shared
// global batches] in paratrain/data/sampler.cpp): each global batch is the
// one one process draws, every position of an epoch is trained once, and
// the shares may change at any batch without skipping or repeating one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"
#include "paratrain/data/sampler.h"

using paratrain::data::DistributedSampler;
using paratrain::data::SamplerOptions;
using paratrain::data::split_by_shares;

namespace {

SamplerOptions shared(std::vector<int64_t> shares, int64_t rank, bool drop_last) {
  SamplerOptions o;
  o.num_replicas = static_cast<int64_t>(shares.size());
  o.rank = rank;
  o.seed = 11;
  o.drop_last = drop_last;
  o.shares = std::move(shares);
  return o;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Global batch j under `shares`: every rank's run of it, in rank order.
std::vector<int64_t> global_batch(int64_t n, const std::vector<int64_t>& shares, int64_t epoch, int64_t j) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < static_cast<int64_t>(shares.size()); ++r) {
    DistributedSampler s(n, shared(shares, r, false));
    s.set_epoch(epoch);
    const auto mine = to_vector(s.indices());
    const int64_t b = shares[static_cast<size_t>(r)];
    out.insert(out.end(), mine.begin() + j * b, mine.begin() + (j + 1) * b);
  }
  return out;
}

}  // namespace

TEST(SplitByShares, ProportionalWholeAndAtLeastOne) {
  EXPECT_EQ(split_by_shares(64, {3, 1}), (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(split_by_shares(64, {1, 2, 1}), (std::vector<int64_t>{16, 32, 16}));
  EXPECT_EQ(split_by_shares(10, {1, 1, 1}), (std::vector<int64_t>{4, 3, 3}));  // ties to the lower rank
  EXPECT_EQ(split_by_shares(3, {1000, 1, 1}), (std::vector<int64_t>{1, 1, 1}));
  for (int64_t total : {5, 17, 100, 257}) {
    const auto sizes = split_by_shares(total, {0.7, 2.5, 1.0, 0.01});
    EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), total);
    for (int64_t b : sizes) EXPECT_GE(b, 1);
  }
  EXPECT_THROW(split_by_shares(1, {1, 1}), std::invalid_argument);
  EXPECT_THROW(split_by_shares(4, {1, 0}), std::invalid_argument);
}

// The union of the ranks' b-th batches is the b-th batch one process draws
// with the whole global batch, for [3, 1] and [1, 2, 1].
TEST(SharedBatches, EachGlobalBatchIsTheOneProcessBatch) {
  const int64_t n = 203;
  for (const std::vector<int64_t>& shares : {std::vector<int64_t>{24, 8}, std::vector<int64_t>{8, 16, 8}}) {
    const int64_t g = std::accumulate(shares.begin(), shares.end(), int64_t{0});
    SamplerOptions one;
    one.seed = 11;
    DistributedSampler single(n, one);
    single.set_epoch(2);
    const auto p = to_vector(single.indices());
    const int64_t batches = (n + g - 1) / g;
    for (int64_t j = 0; j < batches; ++j) {
      std::vector<int64_t> expected;
      for (int64_t i = j * g; i < (j + 1) * g; ++i) expected.push_back(p[static_cast<size_t>(i % n)]);  // padded cyclically
      EXPECT_EQ(global_batch(n, shares, 2, j), expected) << "batch " << j;
    }
  }
}

// Every item of an epoch once (drop_last: the whole global batches' items
// once and nothing else); every rank has the same number of batches.
TEST(SharedBatches, AnEpochCoversTheDataOnce) {
  const int64_t n = 200;
  for (bool drop_last : {false, true}) {
    const std::vector<int64_t> shares{3, 9, 4};
    std::map<int64_t, int> seen;
    int64_t batches = -1;
    for (int64_t r = 0; r < 3; ++r) {
      DistributedSampler s(n, shared(shares, r, drop_last));
      const auto mine = to_vector(s.indices());
      ASSERT_EQ(static_cast<int64_t>(mine.size()) % shares[static_cast<size_t>(r)], 0);
      const int64_t b = static_cast<int64_t>(mine.size()) / shares[static_cast<size_t>(r)];
      if (batches >= 0) {
        EXPECT_EQ(b, batches);
      }
      batches = b;
      for (int64_t i : mine) ++seen[i];
    }
    if (drop_last) {
      EXPECT_EQ(batches, n / 16);
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n / 16 * 16);
      for (auto [item, count] : seen) EXPECT_EQ(count, 1) << item;
    } else {
      EXPECT_EQ(batches, (n + 15) / 16);
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n);  // all of them; the padding repeats a few
      int repeated = 0;
      for (auto [item, count] : seen) repeated += count - 1;
      EXPECT_EQ(repeated, batches * 16 - n);
    }
  }
}

// Shares that change between batches (auto rebalancing, a resume at another
// share vector or world size): loaders at the same batch position continue
// the epoch; over it every item is trained once.
TEST(SharedBatches, ChangingSharesMidEpochSkipsAndRepeatsNothing) {
  const int64_t n = 192;  // 12 global batches of 16
  const std::vector<std::vector<int64_t>> phases{{8, 8}, {12, 4}, {1, 5, 10}, {4, 4, 4, 4}};
  const std::vector<int64_t> until{3, 7, 10, 12};  // batch positions where each phase ends
  auto tensors = paratrain::data::TensorDataset{torch::arange(n, torch::kLong).unsqueeze(1).to(torch::kFloat),
                                                torch::zeros({n}, torch::kLong)};
  std::map<int64_t, int> seen;
  int64_t at = 0;
  for (size_t phase = 0; phase < phases.size(); ++phase) {
    const auto& shares = phases[phase];
    for (int64_t r = 0; r < static_cast<int64_t>(shares.size()); ++r) {
      paratrain::data::LoaderOptions lo;
      lo.batch_size = shares[static_cast<size_t>(r)];
      lo.prefetch_depth = 0;
      paratrain::data::Loader loader(tensors, DistributedSampler(n, shared(shares, r, true)), lo);
      loader.load_state({0, at});
      EXPECT_EQ(loader.positions_per_batch(), 16);
      for (int64_t b = at; b < until[phase]; ++b) {
        auto batch = loader.next();
        ASSERT_TRUE(batch.has_value());
        for (int64_t i : to_vector(batch->inputs.squeeze(1).to(torch::kLong))) ++seen[i];
      }
    }
    at = until[phase];
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
  for (auto [item, count] : seen) EXPECT_EQ(count, 1) << item;
}

TEST(SharedBatches, RejectsSharesThatDoNotFit) {
  auto wrong_count = shared({2, 2}, 0, false);
  wrong_count.num_replicas = 3;
  EXPECT_THROW(DistributedSampler(10, wrong_count), c10::Error);
  EXPECT_THROW(DistributedSampler(10, shared({2, 0}, 0, false)), c10::Error);
  auto tensors = paratrain::data::TensorDataset{torch::zeros({10, 1}), torch::zeros({10}, torch::kLong)};
  paratrain::data::LoaderOptions lo;
  lo.batch_size = 3;  // rank 0's share is 2
  EXPECT_THROW(paratrain::data::Loader(tensors, DistributedSampler(10, shared({2, 2}, 0, false)), lo),
               paratrain::DataError);
}

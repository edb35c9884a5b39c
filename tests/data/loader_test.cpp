// Loader: the prefetching loader against direct synchronous gathering from
// the sampler's indices, resuming at batch k, rank batches versus the
// one-process batch, and the background thread's behaviour (runs ahead by at
// most prefetch_depth, forwards exceptions, stops cleanly mid-epoch).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"

namespace paratrain::data {
namespace {

using namespace std::chrono_literals;

// Row i is (i, i + 0.5, -i) with target i: a batch shows which rows it holds.
TensorDataset numbered(int64_t n) {
  const at::Tensor i = torch::arange(n, torch::kFloat);
  return TensorDataset(torch::stack({i, i + 0.5, -i}, 1), torch::arange(n, torch::kLong));
}

SamplerOptions sampler_opts(int64_t replicas, int64_t rank, uint64_t seed, bool drop_last) {
  SamplerOptions o;
  o.num_replicas = replicas;
  o.rank = rank;
  o.seed = seed;
  o.drop_last = drop_last;
  return o;
}

LoaderOptions loader_opts(int64_t batch, bool drop_last, int depth) {
  LoaderOptions o;
  o.batch_size = batch;
  o.drop_last = drop_last;
  o.prefetch_depth = depth;
  return o;
}

std::vector<Batch> drain(Loader& loader) {
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

bool same(const Batch& a, const Batch& b) {
  return a.inputs.equal(b.inputs) && a.targets.equal(b.targets) && a.indices.equal(b.indices);
}

// The oracle: cut the sampler's indices by hand and index the dataset.
std::vector<Batch> by_hand(const TensorDataset& ds, SamplerOptions so, int64_t epoch, int64_t batch,
                           bool drop_last) {
  DistributedSampler s(ds.size(), so);
  s.set_epoch(epoch);
  const at::Tensor idx = s.indices();
  std::vector<Batch> out;
  for (int64_t start = 0; start < idx.size(0); start += batch) {
    const int64_t stop = std::min(start + batch, idx.size(0));
    if (drop_last && stop - start < batch) break;
    const at::Tensor part = idx.slice(0, start, stop);
    out.push_back(Batch{ds.inputs.index_select(0, part), ds.targets.index_select(0, part), part});
  }
  return out;
}

RC_GTEST_PROP(Loader, PrefetchingEqualsSynchronousGathering, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(1, 200);
  const int64_t replicas = *rc::gen::inRange<int64_t>(1, 5);
  const int64_t rank = *rc::gen::inRange<int64_t>(0, replicas);
  const int64_t batch = *rc::gen::inRange<int64_t>(1, 17);
  const bool sampler_drop = *rc::gen::arbitrary<bool>();
  const bool loader_drop = *rc::gen::arbitrary<bool>();
  const int depth = *rc::gen::inRange(0, 4);
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  const TensorDataset ds = numbered(n);
  const SamplerOptions so = sampler_opts(replicas, rank, seed, sampler_drop);

  Loader loader(ds, DistributedSampler(n, so), loader_opts(batch, loader_drop, depth));
  for (int64_t epoch : {0, 1, 5}) {
    loader.set_epoch(epoch);
    const std::vector<Batch> got = drain(loader);
    const std::vector<Batch> want = by_hand(ds, so, epoch, batch, loader_drop);
    RC_ASSERT(int64_t(got.size()) == loader.num_batches());
    RC_ASSERT(got.size() == want.size());
    for (size_t b = 0; b < got.size(); ++b) RC_ASSERT(same(got[b], want[b]));
    RC_ASSERT((loader.state() == LoaderState{epoch, loader.num_batches()}));
    RC_ASSERT(!loader.next().has_value());  // stays ended until the next set_epoch
  }
}

RC_GTEST_PROP(Loader, ResumingAtBatchKContinuesExactly, ()) {
  const int64_t n = *rc::gen::inRange<int64_t>(1, 150);
  const int64_t batch = *rc::gen::inRange<int64_t>(1, 9);
  const int depth = *rc::gen::inRange(0, 3);
  const int64_t epoch = *rc::gen::inRange<int64_t>(0, 50);
  const TensorDataset ds = numbered(n);
  const SamplerOptions so = sampler_opts(2, 1, 99, false);

  Loader first(ds, DistributedSampler(n, so), loader_opts(batch, false, depth));
  first.set_epoch(epoch);
  const int64_t k = *rc::gen::inRange<int64_t>(0, first.num_batches() + 1);
  for (int64_t i = 0; i < k; ++i) first.next();
  const LoaderState saved = first.state();
  RC_ASSERT((saved == LoaderState{epoch, k}));
  const std::vector<Batch> rest = drain(first);

  // A fresh loader (a restarted process) told where the old one stood.
  Loader resumed(ds, DistributedSampler(n, so), loader_opts(batch, false, depth));
  resumed.load_state(saved);
  const std::vector<Batch> again = drain(resumed);
  RC_ASSERT(again.size() == rest.size());
  for (size_t b = 0; b < rest.size(); ++b) RC_ASSERT(same(again[b], rest[b]));
}

// Two ranks with batch 4 each see, step by step, the rows one process with
// batch 8 sees: the data half of "DDP equals single-process training".
TEST(Loader, RankBatchesMakeTheSingleProcessBatch) {
  const int64_t n = 64;
  const TensorDataset ds = numbered(n);
  Loader single(ds, DistributedSampler(n, sampler_opts(1, 0, 5, false)), loader_opts(8, false, 2));
  Loader rank0(ds, DistributedSampler(n, sampler_opts(2, 0, 5, false)), loader_opts(4, false, 2));
  Loader rank1(ds, DistributedSampler(n, sampler_opts(2, 1, 5, false)), loader_opts(4, false, 2));
  for (int64_t epoch : {0, 3}) {
    single.set_epoch(epoch);
    rank0.set_epoch(epoch);
    rank1.set_epoch(epoch);
    ASSERT_EQ(single.num_batches(), 8);
    ASSERT_EQ(rank0.num_batches(), 8);
    while (auto whole = single.next()) {
      const at::Tensor joined = torch::cat({rank0.next()->targets, rank1.next()->targets});
      EXPECT_TRUE(std::get<0>(joined.sort()).equal(std::get<0>(whole->targets.sort())));
    }
  }
}

TEST(Loader, NumBatchesAndLastBatch) {
  const TensorDataset ds = numbered(10);
  Loader keep(ds, DistributedSampler(10, sampler_opts(1, 0, 0, false)), loader_opts(4, false, 2));
  EXPECT_EQ(keep.num_batches(), 3);
  const std::vector<Batch> batches = drain(keep);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].inputs.size(0), 2);
  Loader drop(ds, DistributedSampler(10, sampler_opts(1, 0, 0, false)), loader_opts(4, true, 2));
  EXPECT_EQ(drop.num_batches(), 2);
  EXPECT_EQ(drain(drop).size(), 2u);
  // The batch owns its memory: writing to it leaves the dataset intact.
  batches[0].inputs.fill_(-7);
  EXPECT_EQ(ds.inputs.min().item<float>(), -9.0f);
}

TEST(Loader, TransformRunsOnTheBackgroundThreadWhenPrefetching) {
  const TensorDataset ds = numbered(20);
  for (int depth : {0, 2}) {
    std::atomic<bool> on_caller{false}, elsewhere{false};
    const auto caller = std::this_thread::get_id();
    LoaderOptions o = loader_opts(5, false, depth);
    o.transform = [&](Batch& b) {
      (std::this_thread::get_id() == caller ? on_caller : elsewhere) = true;
      b.inputs.mul_(2);
    };
    Loader loader(ds, DistributedSampler(20, sampler_opts(1, 0, 0, false)), o);
    const std::vector<Batch> batches = drain(loader);
    ASSERT_EQ(batches.size(), 4u);
    EXPECT_TRUE(batches[0].inputs.equal(ds.inputs.index_select(0, batches[0].indices) * 2));
    EXPECT_EQ(on_caller.load(), depth == 0);
    EXPECT_EQ(elsewhere.load(), depth > 0);
  }
}

// After the consumer takes batch 0 the thread prepares exactly `depth` more
// and then waits: it runs ahead, and memory stays bounded.
TEST(Loader, PrefetchRunsAheadByAtMostDepth) {
  const TensorDataset ds = numbered(100);
  for (int depth : {1, 2, 3}) {
    std::atomic<int> prepared{0};
    LoaderOptions o = loader_opts(5, false, depth);
    o.transform = [&](Batch&) { ++prepared; };
    Loader loader(ds, DistributedSampler(100, sampler_opts(1, 0, 0, false)), o);
    ASSERT_TRUE(loader.next().has_value());
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (prepared.load() < 1 + depth && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(prepared.load(), 1 + depth) << "the loader did not prepare batches ahead";
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(prepared.load(), 1 + depth) << "the loader ran further ahead than prefetch_depth";
    ASSERT_TRUE(loader.next().has_value());
    while (prepared.load() < 2 + depth && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(prepared.load(), 2 + depth);
  }
}

TEST(Loader, ExceptionsReachTheConsumerInOrder) {
  const TensorDataset ds = numbered(40);
  for (int depth : {0, 1, 3}) {
    LoaderOptions o = loader_opts(5, false, depth);
    o.transform = [](Batch& b) {
      if (b.indices[0].item<int64_t>() == 10) throw std::runtime_error("augmentation failed on row 10");
    };
    SamplerOptions in_order = sampler_opts(1, 0, 0, false);
    in_order.shuffle = false;
    Loader loader(ds, DistributedSampler(40, in_order), o);
    ASSERT_TRUE(loader.next().has_value());  // rows 0-4
    ASSERT_TRUE(loader.next().has_value());  // rows 5-9
    testing::expect_error<std::runtime_error>([&] { loader.next(); }, {"augmentation failed on row 10"});
    EXPECT_EQ(loader.state().next_batch, 2);
    // Restarting the position discards the failure along with the thread.
    loader.load_state({0, 3});
    EXPECT_EQ(loader.next()->indices[0].item<int64_t>(), 15);
  }
}

TEST(Loader, DestroyedMidEpochStopsCleanly) {
  const TensorDataset ds = numbered(1000);
  // Blocked on a full queue.
  {
    Loader loader(ds, DistributedSampler(1000, sampler_opts(1, 0, 0, false)), loader_opts(10, false, 2));
    loader.next();
    std::this_thread::sleep_for(20ms);
  }
  // Busy inside a slow transform.
  {
    LoaderOptions o = loader_opts(10, false, 2);
    o.transform = [](Batch&) { std::this_thread::sleep_for(30ms); };
    Loader loader(ds, DistributedSampler(1000, sampler_opts(1, 0, 0, false)), o);
    loader.next();
  }
  // Moved mid-epoch: the new owner continues, the old one is inert.
  Loader a(ds, DistributedSampler(1000, sampler_opts(1, 0, 0, false)), loader_opts(10, false, 2));
  const Batch first = *a.next();
  Loader b = std::move(a);
  EXPECT_EQ(b.state().next_batch, 1);
  EXPECT_EQ(drain(b).size(), 99u);
}

TEST(Loader, RejectsStateThatDoesNotFit) {
  const TensorDataset ds = numbered(10);
  Loader loader(ds, DistributedSampler(10, sampler_opts(2, 0, 0, false)), loader_opts(2, false, 2));
  ASSERT_EQ(loader.num_batches(), 3);
  loader.load_state({4, 3});  // the end of epoch 4 is a valid position
  EXPECT_FALSE(loader.next().has_value());
  testing::expect_error<CheckpointError>([&] { loader.load_state({0, 4}); },
                                         {"next_batch 4", "3 batches", "batch size"});
  testing::expect_error<CheckpointError>([&] { loader.load_state({-1, 0}); }, {"epoch -1"});
  testing::expect_error<DataError>(
      [&] { Loader(ds, DistributedSampler(11, sampler_opts(1, 0, 0, false)), loader_opts(2, false, 2)); },
      {"11 items", "dataset has 10"});
}

TEST(Loader, SetEpochStartsOverAndAllowsSkippingEpochs) {
  const TensorDataset ds = numbered(30);
  const SamplerOptions so = sampler_opts(1, 0, 1, false);
  Loader loader(ds, DistributedSampler(30, so), loader_opts(7, false, 2));
  loader.next();
  loader.set_epoch(6);  // mid-epoch jump
  const std::vector<Batch> got = drain(loader);
  const std::vector<Batch> want = by_hand(ds, so, 6, 7, false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < got.size(); ++b) EXPECT_TRUE(same(got[b], want[b]));
  EXPECT_EQ(loader.sampler().epoch(), 6);
}

}  // namespace
}  // namespace paratrain::data

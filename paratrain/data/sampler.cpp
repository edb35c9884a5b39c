// DistributedSampler: one permutation shared by all ranks, split by stride.
#include "paratrain/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace paratrain::data {

// Note [Strided split]
// Every rank draws the same permutation P (same generator seed), pads or
// truncates it to T = R * n entries, and keeps P[r], P[r + R], P[r + 2R], ...
// Rank r's b-th batch of size B is then {P[j*R + r] : bB <= j < (b+1)B}, and
// the union over r is exactly P[bBR, (b+1)BR): the b-th batch of a single
// process drawing batches of B*R from the same P. So data-parallel training
// on R ranks with per-rank batch B sees, step by step, the same examples as
// one process with batch B*R, which is what lets tests compare DDP against
// single-process training, and lets a run resume at global step b on a
// different number of ranks as long as B*R is kept. A contiguous split
// (rank r takes P[r*n, (r+1)*n)) would give the same epoch but different
// steps. The padding repeats the start of P (P[i mod N] for i >= N), as
// PyTorch does, so within the padded tail the property holds against P's
// padded extension, not against the N-item single-process epoch.

// Note [Remaining samples]
// In-job recovery (train/recovery/in_job.h) changes the number of ranks in the middle
// of an epoch. The steps taken so far trained the prefix P[0, c) of the
// epoch's permutation (strided split: c = steps * global batch, plus the
// start of an earlier recovery in the same epoch). The survivors go on with
// the same P cut at c: P[c, N) padded or truncated for the new R and split
// by stride, so over the whole epoch every item of P[0, N) is trained exactly
// once (as often as without a failure, padding aside), the dead rank's share
// of the rest included. Later epochs start at 0 again.

// Note [Shared global batches]
// With data.batch_shares ranks compute micro-batches of different sizes
// b_0 .. b_{R-1}, G = sum b_r. The epoch's permutation P (padded cyclically
// to a whole number of global batches, or truncated to one with drop_last)
// is read as global batches of G positions, and rank r takes the run
// [j*G + o_r, j*G + o_r + b_r) of global batch j, o_r = b_0 + .. + b_{r-1}.
// Global batch j is then P[jG, (j+1)G) whatever the shares are, the batch
// one process with batch G draws: so the weighted gradient (train/loop,
// Note [Weighted shares]) equals one process's, a run may change its shares
// at any step (auto rebalancing) and resume at another share vector or with
// none, and every position of the epoch is trained once. The strided split
// gives the same global batches (Note [Strided split]), so a checkpoint's
// loader position means the same under either. One exception, the tail
// without drop_last: the last global batch is padded to G with the epoch's
// first positions (the strided split pads fewer, one process draws a partial
// batch), so that step is not one process's step (data.drop_last = true, the
// default, has no tail).

std::vector<int64_t> split_by_shares(int64_t total, const std::vector<double>& weights) {
  const auto n = static_cast<int64_t>(weights.size());
  if (n == 0 || total < n) {
    throw std::invalid_argument("split_by_shares: " + std::to_string(total) + " items cannot give each of " +
                                std::to_string(n) + " ranks at least one");
  }
  double sum = 0;
  for (double w : weights) {
    if (!(w > 0) || !std::isfinite(w)) throw std::invalid_argument("split_by_shares: a weight is not positive");
    sum += w;
  }
  // Each rank's one item first, then the rest by largest remainder.
  const int64_t rest = total - n;
  std::vector<int64_t> sizes(weights.size(), 1);
  std::vector<std::pair<double, int64_t>> remainders;
  int64_t given = 0;
  for (int64_t r = 0; r < n; ++r) {
    const double exact = static_cast<double>(rest) * weights[static_cast<size_t>(r)] / sum;
    const auto whole = static_cast<int64_t>(std::floor(exact));
    sizes[static_cast<size_t>(r)] += whole;
    given += whole;
    remainders.emplace_back(exact - static_cast<double>(whole), r);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int64_t i = 0; i < rest - given; ++i) ++sizes[static_cast<size_t>(remainders[static_cast<size_t>(i)].second)];
  return sizes;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  TORCH_CHECK(options_.num_replicas >= 1, "SamplerOptions.num_replicas must be >= 1, got ",
              options_.num_replicas);
  TORCH_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas, "SamplerOptions.rank ",
              options_.rank, " is out of range for num_replicas ", options_.num_replicas);
  TORCH_CHECK(dataset_size_ >= 0, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size_);
  if (!options_.shares.empty()) {
    TORCH_CHECK(static_cast<int64_t>(options_.shares.size()) == options_.num_replicas, "SamplerOptions.shares has ",
                options_.shares.size(), " entries for ", options_.num_replicas, " replicas");
    for (int64_t b : options_.shares) TORCH_CHECK(b >= 1, "SamplerOptions.shares: every share must be >= 1, got ", b);
  }
  TORCH_CHECK(dataset_size_ > 0 || options_.drop_last,
              "DistributedSampler: cannot pad an empty dataset to ", options_.num_replicas,
              " replicas; the dataset has no items");
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t first_position) {
  TORCH_CHECK(epoch >= 0, "DistributedSampler::set_epoch: epoch must be >= 0, got ", epoch);
  TORCH_CHECK(first_position >= 0 && (first_position < dataset_size_ || first_position == 0),
              "DistributedSampler::set_epoch: first_position ", first_position, " is outside the epoch of ",
              dataset_size_, " items");
  epoch_ = epoch;
  first_position_ = first_position;
  const int64_t R = options_.num_replicas;
  const int64_t n = dataset_size_ - first_position_;
  if (!options_.shares.empty()) {
    const int64_t global = global_batch();
    const int64_t batches = options_.drop_last ? n / global : (n + global - 1) / global;
    num_samples_ = batches * options_.shares[static_cast<size_t>(options_.rank)];
    return;
  }
  // PyTorch: drop_last -> ceil((N - R) / R) == floor(N / R) when N % R != 0;
  // otherwise ceil(N / R).
  num_samples_ = options_.drop_last ? n / R : (n + R - 1) / R;
}

at::Tensor DistributedSampler::indices() const {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const int64_t total = total_size();
  if (total == 0) return at::empty({0}, long_opts);
  at::Tensor order;
  if (options_.shuffle) {
    // Our own generator: the global torch RNG, which seeds model init and
    // dropout, is never advanced by sampling.
    at::Generator gen =
        at::detail::createCPUGenerator(options_.seed + static_cast<uint64_t>(epoch_));
    order = at::randperm(dataset_size_, gen, long_opts);
  } else {
    order = at::arange(dataset_size_, long_opts);
  }
  // Padding: position i of the padded epoch holds order[i mod N]; with
  // drop_last total <= N and this is a plain truncation. After a recovery
  // the same over order[first_position:].
  const at::Tensor positions = options_.shares.empty()
                                    ? at::arange(options_.rank, total, options_.num_replicas, long_opts)
                                    : shared_positions();
  if (first_position_ == 0) return order.index_select(0, positions.remainder(dataset_size_));
  return order.slice(0, first_position_).index_select(0, positions.remainder(dataset_size_ - first_position_));
}

int64_t DistributedSampler::total_size() const {
  if (options_.shares.empty()) return num_samples_ * options_.num_replicas;
  return num_samples_ / options_.shares[static_cast<size_t>(options_.rank)] * global_batch();
}

int64_t DistributedSampler::global_batch() const {
  int64_t sum = 0;
  for (int64_t b : options_.shares) sum += b;
  return sum;
}

// Positions of this rank's runs, global batch by global batch (Note [Shared
// global batches]), before the cyclic padding.
at::Tensor DistributedSampler::shared_positions() const {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const int64_t mine = options_.shares[static_cast<size_t>(options_.rank)];
  int64_t offset = 0;
  for (int64_t r = 0; r < options_.rank; ++r) offset += options_.shares[static_cast<size_t>(r)];
  const int64_t batches = num_samples_ / mine;
  const at::Tensor starts = at::arange(batches, long_opts) * global_batch() + offset;
  return (starts.unsqueeze(1) + at::arange(mine, long_opts).unsqueeze(0)).reshape({-1});
}

}  // namespace paratrain::data

// DistributedSampler: one permutation shared by all ranks, split by stride.
#include "paratrain/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

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

DistributedSampler::DistributedSampler(int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  TORCH_CHECK(options_.num_replicas >= 1, "SamplerOptions.num_replicas must be >= 1, got ",
              options_.num_replicas);
  TORCH_CHECK(options_.rank >= 0 && options_.rank < options_.num_replicas, "SamplerOptions.rank ",
              options_.rank, " is out of range for num_replicas ", options_.num_replicas);
  TORCH_CHECK(dataset_size_ >= 0, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size_);
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
  const at::Tensor positions = at::arange(options_.rank, total, options_.num_replicas, long_opts);
  if (first_position_ == 0) return order.index_select(0, positions.remainder(dataset_size_));
  return order.slice(0, first_position_).index_select(0, positions.remainder(dataset_size_ - first_position_));
}

}  // namespace paratrain::data

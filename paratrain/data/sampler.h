// DistributedSampler: which dataset rows each rank sees in each epoch, with
// the semantics of PyTorch's torch.utils.data.DistributedSampler (same
// padding, same strided split, same permutation for the same seed + epoch).
// Not a loader: it hands out indices; loader.h turns them into batches.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace paratrain::data {

/// How DistributedSampler splits and orders the dataset.
struct SamplerOptions {
  /// Ranks sharing the dataset (the data-parallel group size) and ours.
  int64_t num_replicas = 1;
  int64_t rank = 0;  ///< this rank in 0 .. num_replicas - 1
  /// Permute each epoch. false = every epoch in dataset order: reproducible
  /// by eye, but batches are then correlated with how the file is sorted.
  bool shuffle = true;
  /// Every rank must use the same seed, or ranks would draw different
  /// permutations and overlap.
  uint64_t seed = 0;
  /// When the dataset does not split evenly: false pads by repeating indices
  /// from the start of the epoch (some items counted twice per epoch); true
  /// drops the tail (some items unseen this epoch, a different tail each
  /// shuffled epoch).
  bool drop_last = false;
  /// Unequal shares (data.batch_shares, Note [Shared global batches] in
  /// sampler.cpp): rank r's micro-batch size, one entry per replica. Empty
  /// = the strided split with one per-rank batch size (the loader's).
  std::vector<int64_t> shares;
};

/// Integer sizes that sum to `total`, one per weight, proportional to the
/// weights (largest remainder; ties to the lower index), each at least 1.
/// Throws std::invalid_argument when total < weights.size() or a weight is
/// not positive and finite.
std::vector<int64_t> split_by_shares(int64_t total, const std::vector<double>& weights);

/// Rank r's indices for an epoch: P = randperm(N) drawn from a generator
/// seeded with seed + epoch (or 0..N-1 without shuffle), padded cyclically to
/// a multiple of num_replicas (or truncated with drop_last), then P[r::R].
/// Because the split is strided, the b-th size-B batches of all R ranks
/// together are the b-th size-B*R batch of the one-process sampler with the
/// same seed and epoch. See Note [Strided split] in sampler.cpp. With
/// options.shares each global batch of sum(shares) positions is cut into
/// consecutive runs instead (Note [Shared global batches]).
class DistributedSampler {
 public:
  /// For a dataset of `dataset_size` items; starts at epoch 0.
  DistributedSampler(int64_t dataset_size, SamplerOptions options);

  /// Chooses the epoch whose permutation indices() returns. Every rank must
  /// call it with the same value before each epoch, as in PyTorch.
  /// `first_position` > 0 splits only P[first_position, N) among the ranks
  /// (padded or truncated as above, over those N - first_position items):
  /// the positions before it were trained before an in-job recovery changed
  /// the number of ranks (Note [Remaining samples] in sampler.cpp).
  void set_epoch(int64_t epoch, int64_t first_position = 0);
  int64_t epoch() const { return epoch_; }  ///< the epoch set last (0 at first)
  int64_t first_position() const { return first_position_; }  ///< as set with the epoch

  /// This rank's indices for the current epoch: int64 [num_samples()].
  /// Recomputed on each call (one randperm of N: ~1.5 ms for 60000 here).
  at::Tensor indices() const;

  /// Items per rank per epoch, and over all ranks (>= N - first_position when padding).
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const;  ///< over all ranks
  int64_t dataset_size() const { return dataset_size_; }  ///< N
  const SamplerOptions& options() const { return options_; }  ///< as constructed

 private:
  int64_t global_batch() const;         // sum of options_.shares
  at::Tensor shared_positions() const;  // this rank's positions under shares

  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t first_position_ = 0;
};

}  // namespace paratrain::data

// Loader: the batches one rank trains on, epoch by epoch: its sampler's
// indices cut into batches, gathered from an in-memory dataset, prepared on
// a background thread while the current batch trains. Not a multi-process
// loader: gathering rows from memory is cheap enough for one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "paratrain/data/dataset.h"
#include "paratrain/data/sampler.h"

namespace paratrain::data {

class Prefetcher;

/// How a Loader batches what its sampler chose.
struct LoaderOptions {
  /// Per-rank batch size; the global batch is batch_size * num_replicas
  /// (with the sampler's shares: this rank's share, and their sum; or k
  /// shares, k runs of consecutive global batches, and k times their sum).
  int64_t batch_size = 32;
  /// Drop the epoch's last batch when it is smaller than batch_size. Ranks
  /// always get the same number of batches (the sampler evens out per-rank
  /// counts), so this is about a short final step, not about rank agreement.
  bool drop_last = false;
  /// Batches prepared ahead of the consumer on a background thread. Memory
  /// is up to prefetch_depth extra batches; more than 2 rarely helps since
  /// gathering is much faster than a training step. 0 = gather in next()
  /// on the caller's thread (the synchronous twin, for tests and debugging).
  int prefetch_depth = 2;
  /// Optional per-batch work run where the batch is prepared (the background
  /// thread when prefetching): augmentation, dtype or device conversion.
  /// Must be thread-safe against the training thread; exceptions propagate
  /// to next().
  std::function<void(Batch&)> transform;
};

/// Where the loader stands, for checkpoints: the consumer has taken batches
/// 0 .. next_batch-1 of `epoch`. Batches prefetched but not yet taken are not
/// counted, so a run resumed from this state continues exactly where it stopped.
/// next_batch is also the global step within the epoch: a run restarted on
/// another number of ranks with the same global batch (batch_size *
/// num_replicas) may resume from it and see the same examples per step
/// (Note [Strided split] in sampler.cpp; exact outside the padded tail).
struct LoaderState {
  int64_t epoch = 0;       ///< the epoch in progress
  int64_t next_batch = 0;  ///< batches of it already taken (after first_position)
  /// Positions of the epoch's permutation trained before an in-job recovery
  /// changed the number of ranks (DistributedSampler::set_epoch); 0 otherwise.
  int64_t first_position = 0;
  bool operator==(const LoaderState&) const = default;
};

/// Usage:
///   Loader loader(dataset, DistributedSampler(dataset.size(), sampler_opts), {});
///   loader.load_state(checkpoint.loader);   // or nothing: epoch 0, batch 0
///   for (int64_t e = loader.state().epoch; e < epochs; ++e) {
///     if (e != loader.state().epoch) loader.set_epoch(e);
///     while (auto batch = loader.next()) train_step(*batch);
///   }
/// Resuming: load_state({epoch, k}) makes next() start at batch k of that
/// epoch; the batches are the ones an uninterrupted run would have seen
/// there, because each epoch's order is a pure function of (seed, epoch).
class Loader {
 public:
  /// Throws DataError if the sampler was built for a different dataset size.
  Loader(TensorDataset dataset, DistributedSampler sampler, LoaderOptions options);
  ~Loader();  ///< stops the background thread, also mid-epoch
  Loader(Loader&&) noexcept;             ///< moves the background thread too
  Loader& operator=(Loader&&) noexcept;  ///< moves the background thread too

  /// Starts `epoch` at batch 0 (sets the sampler's epoch too).
  void set_epoch(int64_t epoch) { load_state(LoaderState{epoch, 0}); }
  /// Continues at batch state.next_batch of state.epoch. Throws
  /// CheckpointError if next_batch is past this epoch's num_batches() (a
  /// checkpoint from another batch size, world size or dataset).
  void load_state(const LoaderState& state);
  LoaderState state() const { return state_; }  ///< for checkpoints: see LoaderState

  /// The next batch of the current epoch, or nullopt when the epoch is over
  /// (then call set_epoch for the next one). Rethrows what preparing the
  /// batch threw (gather or transform).
  std::optional<Batch> next();

  /// Batches per epoch for this rank (the same on every rank).
  int64_t num_batches() const;
  /// Positions of the epoch's permutation one batch of every rank covers:
  /// batch_size x replicas, or the sum of the sampler's shares (times the
  /// runs a batch holds).
  int64_t positions_per_batch() const;
  const DistributedSampler& sampler() const { return sampler_; }  ///< its indices per epoch
  const TensorDataset& dataset() const { return dataset_; }       ///< the whole dataset
  const LoaderOptions& options() const { return options_; }       ///< as constructed

 private:
  TensorDataset dataset_;
  DistributedSampler sampler_;
  LoaderOptions options_;
  LoaderState state_;
  /// This epoch's indices (computed at the first next() of an epoch) and the
  /// thread preparing batches from them; reset whenever the position jumps.
  at::Tensor epoch_indices_;
  std::unique_ptr<Prefetcher> prefetcher_;
};

}  // namespace paratrain::data

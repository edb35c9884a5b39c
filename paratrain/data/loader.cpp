// Loader: epoch position bookkeeping around the sampler and the prefetcher.
#include "paratrain/data/loader.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/data/prefetcher.h"

namespace paratrain::data {
namespace {

// Batch b of an epoch: the synchronous path and the prefetcher both call
// this, so they cannot drift apart.
Batch prepare_batch(const TensorDataset& dataset, const at::Tensor& epoch_indices, int64_t batch_size,
                    const std::function<void(Batch&)>& transform, int64_t b);

}  // namespace

Loader::Loader(TensorDataset dataset, DistributedSampler sampler, LoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(std::move(options)) {
  TORCH_CHECK(options_.batch_size >= 1, "LoaderOptions.batch_size must be >= 1, got ",
              options_.batch_size);
  TORCH_CHECK(options_.prefetch_depth >= 0, "LoaderOptions.prefetch_depth must be >= 0, got ",
              options_.prefetch_depth);
  if (sampler_.dataset_size() != dataset_.size()) {
    throw DataError(fmt::format("Loader: the sampler was built for {} items but the dataset has {}",
                                sampler_.dataset_size(), dataset_.size()));
  }
  const auto& shares = sampler_.options().shares;
  if (!shares.empty() && options_.batch_size % shares.at(static_cast<size_t>(sampler_.options().rank)) != 0) {
    throw DataError(fmt::format("Loader: batch_size {} is not a multiple of this rank's share {} of the sampler's "
                                "shares",
                                options_.batch_size, shares.at(static_cast<size_t>(sampler_.options().rank))));
  }
  state_.epoch = sampler_.epoch();
}

Loader::~Loader() = default;
Loader::Loader(Loader&&) noexcept = default;
Loader& Loader::operator=(Loader&&) noexcept = default;

int64_t Loader::num_batches() const {
  const int64_t n = sampler_.num_samples();
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t Loader::positions_per_batch() const {
  const auto& shares = sampler_.options().shares;
  if (shares.empty()) return options_.batch_size * sampler_.options().num_replicas;
  int64_t sum = 0;
  for (int64_t b : shares) sum += b;
  // A batch of k runs of this rank's (every rank's batch holds k).
  return options_.batch_size / shares.at(static_cast<size_t>(sampler_.options().rank)) * sum;
}

void Loader::load_state(const LoaderState& state) {
  if (state.epoch < 0 || state.first_position < 0 || state.first_position >= std::max<int64_t>(dataset_.size(), 1)) {
    throw CheckpointError(fmt::format("Loader state (epoch {}, first position {}) does not fit a dataset of {} items",
                                      state.epoch, state.first_position, dataset_.size()));
  }
  prefetcher_.reset();  // joins the thread before the position changes
  epoch_indices_ = at::Tensor();
  const LoaderState before = state_;
  sampler_.set_epoch(state.epoch, state.first_position);
  if (state.next_batch < 0 || state.next_batch > num_batches()) {
    sampler_.set_epoch(before.epoch, before.first_position);  // a refused state changes nothing
    throw CheckpointError(fmt::format(
        "Loader state (epoch {}, next_batch {}) does not fit this loader: an epoch has {} batches "
        "of {} items on rank {} of {} for {} dataset items; was the checkpoint written with another "
        "batch size, world size or dataset?",
        state.epoch, state.next_batch, num_batches(), options_.batch_size, sampler_.options().rank,
        sampler_.options().num_replicas, sampler_.dataset_size()));
  }
  state_ = state;
}

std::optional<Batch> Loader::next() {
  const int64_t total = num_batches();
  if (state_.next_batch >= total) return std::nullopt;
  if (!epoch_indices_.defined()) epoch_indices_ = sampler_.indices();

  std::optional<Batch> batch;
  if (options_.prefetch_depth == 0) {
    batch = prepare_batch(dataset_, epoch_indices_, options_.batch_size, options_.transform,
                          state_.next_batch);
  } else {
    if (!prefetcher_) {
      // The producer holds copies (tensors are shared handles), never
      // `this`, so moving the Loader cannot leave it dangling.
      prefetcher_ = std::make_unique<Prefetcher>(
          state_.next_batch, total, options_.prefetch_depth,
          [dataset = dataset_, indices = epoch_indices_, batch_size = options_.batch_size,
           transform = options_.transform](int64_t b) {
            return prepare_batch(dataset, indices, batch_size, transform, b);
          });
    }
    batch = prefetcher_->next();
    TORCH_INTERNAL_ASSERT(batch.has_value(), "Loader: prefetcher ended before batch ",
                          state_.next_batch, " of ", total);
  }
  ++state_.next_batch;
  if (state_.next_batch == total) prefetcher_.reset();  // epoch done: end the thread now
  return batch;
}

namespace {

Batch prepare_batch(const TensorDataset& dataset, const at::Tensor& epoch_indices, int64_t batch_size,
                    const std::function<void(Batch&)>& transform, int64_t b) {
  const int64_t start = b * batch_size;
  const int64_t stop = std::min(start + batch_size, epoch_indices.size(0));
  Batch out = gather(dataset, epoch_indices.slice(0, start, stop));
  if (transform) transform(out);
  return out;
}

}  // namespace
}  // namespace paratrain::data

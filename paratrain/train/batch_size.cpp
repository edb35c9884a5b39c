// Batch sizes: see batch_size.h.
#include "paratrain/train/batch_size.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train {

BatchSizes resolve_batch_sizes(const TrainConfig& config, int dp) {
  const int64_t global = config.data.global_batch_size;
  if (global == 0) return {config.data.batch_size, config.data.batch_size * dp};
  if (global % dp != 0) {
    throw ConfigError(fmt::format(
        "data.global_batch_size = {} does not divide over {} data-parallel ranks; use a multiple of {} (e.g. {}) "
        "or another number of ranks",
        global, dp, dp, (global / dp + 1) * dp));
  }
  return {global / dp, global};
}

void check_batches_fit(const TrainConfig& config, const BatchSizes& sizes, int64_t train_items,
                       int64_t batches_per_epoch) {
  if (batches_per_epoch > 0) return;
  throw ConfigError(fmt::format(
      "the global batch of {} examples ({} per data-parallel rank) is larger than the training set of {} items, "
      "so an epoch has no step{}: lower data.batch_size or data.global_batch_size",
      sizes.global, sizes.per_rank, train_items,
      config.data.drop_last ? " (data.drop_last = true drops the incomplete batch)" : ""));
}

}  // namespace paratrain::train

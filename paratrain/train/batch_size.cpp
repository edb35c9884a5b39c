// Batch sizes: see batch_size.h.
#include "paratrain/train/batch_size.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train {

BatchSizes resolve_batch_sizes(const TrainConfig& config, int dp) {
  const int64_t k = config.train.accumulate;
  const int64_t global = config.data.global_batch_size;
  if (global == 0) return {config.data.batch_size, k, config.data.batch_size * dp * k, {}};
  const int64_t parts = dp * k;
  if (global % parts != 0) {
    throw ConfigError(fmt::format(
        "data.global_batch_size = {} does not divide over {} data-parallel ranks x train.accumulate = {} "
        "micro-batches; use a multiple of {} (e.g. {}), or another number of ranks or micro-batches",
        global, dp, k, parts, (global / parts + 1) * parts));
  }
  return {global / parts, k, global, {}};
}

void check_batches_fit(const TrainConfig& config, const BatchSizes& sizes, int64_t train_items,
                       int64_t steps_per_epoch) {
  if (steps_per_epoch > 0) return;
  throw ConfigError(fmt::format(
      "the global batch of {} examples ({} per data-parallel rank x train.accumulate = {}) is larger than the "
      "training set of {} items, so an epoch has no optimizer step{}: lower data.batch_size, "
      "data.global_batch_size or train.accumulate",
      sizes.global, sizes.per_rank, sizes.accumulate, train_items,
      config.data.drop_last ? " (data.drop_last = true drops the incomplete batch)" : ""));
}

std::optional<BatchSizes> keep_global_batch_over(const BatchSizes& now, int64_t dp) {
  if (dp < 1) return std::nullopt;
  if (now.global % (dp * now.accumulate) == 0) return BatchSizes{now.global / (dp * now.accumulate), now.accumulate, now.global, {}};
  if (now.global % (dp * now.per_rank) == 0) return BatchSizes{now.per_rank, now.global / (dp * now.per_rank), now.global, {}};
  return std::nullopt;
}

}  // namespace paratrain::train

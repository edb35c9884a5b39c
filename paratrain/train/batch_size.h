// Batch sizes from the config and the data-parallel size: the per-rank batch
// (data.batch_size) or the global batch (data.global_batch_size, divided over
// dp ranks), and the check that an epoch has at least one step.
#pragma once

#include <cstdint>

#include "paratrain/train/config.h"

namespace paratrain::train {

struct BatchSizes {
  int64_t per_rank = 0;  // examples each dp rank computes per step
  int64_t global = 0;    // examples per optimizer step over all dp ranks
};

// Throws ConfigError when data.global_batch_size does not divide by `dp`.
BatchSizes resolve_batch_sizes(const TrainConfig& config, int dp);

// Throws ConfigError when the loader yields no step per epoch (a batch larger
// than the dataset with drop_last), naming the sizes and what to change.
void check_batches_fit(const TrainConfig& config, const BatchSizes& sizes, int64_t train_items,
                       int64_t batches_per_epoch);

}  // namespace paratrain::train

// Batch sizes from the config and the data-parallel size: the per-rank
// micro-batch (data.batch_size) or the global batch (data.global_batch_size,
// divided over dp ranks and train.accumulate micro-batches), and the check
// that an epoch has at least one optimizer step.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "paratrain/train/config/config.h"

namespace paratrain::train {

struct BatchSizes {
  int64_t per_rank = 0;    // examples each dp rank computes per micro-batch (one forward/backward)
  int64_t accumulate = 1;  // micro-batches per optimizer step (train.accumulate)
  int64_t global = 0;      // examples per optimizer step over all dp ranks: per_rank * dp * accumulate
  // data.batch_shares: each dp rank's micro-batch size (summing to per_rank
  // * dp); empty = every rank per_rank, the strided split.
  std::vector<int64_t> shares;
};

// Throws ConfigError when data.global_batch_size does not divide by
// dp * train.accumulate.
BatchSizes resolve_batch_sizes(const TrainConfig& config, int dp);

// Throws ConfigError when an epoch has no optimizer step (a global batch
// larger than the dataset with drop_last, or fewer loader batches than
// train.accumulate), naming the sizes and what to change.
void check_batches_fit(const TrainConfig& config, const BatchSizes& sizes, int64_t train_items,
                       int64_t steps_per_epoch);

// elastic.keep_global_batch (Note [Keeping the global batch] in
// restart_resume.cpp): the sizes that keep `now.global` at `dp` data-parallel
// ranks: the per-rank batch now.global / (dp * accumulate) when it divides
// (one forward/backward per step, the cheapest), else train.accumulate
// now.global / (dp * per_rank); nullopt when neither divides (the caller
// names its keys in the error). Used by restarted generations and by in-job
// recovery alike.
std::optional<BatchSizes> keep_global_batch_over(const BatchSizes& now, int64_t dp);

}  // namespace paratrain::train

// The items of an epoch under dynamic batch assignment (Strategy::
// dynamic_batches, Note [Dynamic batches] in param_server/server.h): item x
// is dp rank x % R's step x / R of its DistributedSampler share, so the
// items of an epoch hold exactly the examples the fixed shares hold, each
// once; only which rank trains an item changes. Not the queue (the
// strategy hands out items), not the loader (it reads one fixed share).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "paratrain/data/sampler.h"

namespace paratrain::train {

class EpochItems {
 public:
  // `options`: the Trainer's sampler options (num_replicas = R, any rank);
  // `batch_size` per rank and `accumulate` micro-batches per step.
  EpochItems(int64_t dataset_size, data::SamplerOptions options, int64_t epoch, int64_t batch_size,
             int64_t accumulate);
  // Dataset rows of micro-batch `micro` (0 .. accumulate - 1) of item `item`.
  at::Tensor rows(int64_t item, int64_t micro) const;
  int64_t replicas() const { return static_cast<int64_t>(shares_.size()); }

 private:
  std::vector<at::Tensor> shares_;  // per dp rank: its sampler indices this epoch
  int64_t batch_size_;
  int64_t accumulate_;
};

}  // namespace paratrain::train

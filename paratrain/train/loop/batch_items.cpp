// The items of an epoch under dynamic batch assignment: see batch_items.h.
#include "paratrain/train/loop/batch_items.h"

#include <torch/torch.h>

#include <algorithm>

namespace paratrain::train {

EpochItems::EpochItems(int64_t dataset_size, data::SamplerOptions options, int64_t epoch, int64_t batch_size,
                       int64_t accumulate)
    : batch_size_(batch_size), accumulate_(accumulate) {
  TORCH_CHECK(batch_size >= 1 && accumulate >= 1, "EpochItems: batch size ", batch_size, ", accumulate ",
              accumulate);
  for (int64_t r = 0; r < options.num_replicas; ++r) {
    options.rank = r;
    data::DistributedSampler sampler(dataset_size, options);
    sampler.set_epoch(epoch);
    shares_.push_back(sampler.indices());
  }
}

at::Tensor EpochItems::rows(int64_t item, int64_t micro) const {
  TORCH_CHECK(item >= 0 && micro >= 0 && micro < accumulate_, "EpochItems::rows: item ", item, ", micro-batch ",
              micro);
  const auto& share = shares_.at(static_cast<size_t>(item % replicas()));
  // The loader's batch b of that rank: the same slice (loader.cpp).
  const int64_t b = (item / replicas()) * accumulate_ + micro;
  const int64_t start = std::min(b * batch_size_, share.size(0));
  return share.slice(0, start, std::min(start + batch_size_, share.size(0)));
}

}  // namespace paratrain::train

// In-memory datasets: a pair of tensors whose first dimension indexes items,
// and the Batch a Loader hands out. Not a streaming or on-disk dataset: every
// dataset we train on (Fashion-MNIST, synthetic) fits in memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace paratrain::data {

/// inputs[i] and targets[i] are item i. Tensors are shared, not copied:
/// copying a TensorDataset is cheap and both copies see the same storage.
struct TensorDataset {
  at::Tensor inputs;   ///< [N, ...] (float32 for the datasets we build)
  at::Tensor targets;  ///< [N] int64 class labels, or [N, K] float regression targets

  /// Throws DataError unless both are defined and agree on N.
  TensorDataset(at::Tensor inputs, at::Tensor targets);
  TensorDataset() = default;

  int64_t size() const;  ///< N, the number of items
};

/// One batch of items, in the order the sampler chose them.
struct Batch {
  at::Tensor inputs;   ///< [B, ...]
  at::Tensor targets;  ///< [B] or [B, K]
  /// Dataset row of each item (int64 [B]): what was gathered, for debugging,
  /// logging and tests; training code needs only inputs and targets.
  at::Tensor indices;
};

/// Gathers rows `indices` (int64 [B]) of the dataset into a new Batch.
Batch gather(const TensorDataset& dataset, const at::Tensor& indices);

}  // namespace paratrain::data

// TensorDataset validation and the batch gather every loader path shares
// (synchronous and prefetching), so both produce bit-identical batches.
#include "paratrain/data/dataset.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"

namespace paratrain::data {

TensorDataset::TensorDataset(at::Tensor inputs_in, at::Tensor targets_in)
    : inputs(std::move(inputs_in)), targets(std::move(targets_in)) {
  if (!inputs.defined() || !targets.defined()) {
    throw DataError("TensorDataset: inputs and targets must both be defined tensors");
  }
  if (inputs.dim() == 0 || targets.dim() == 0) {
    throw DataError(fmt::format(
        "TensorDataset: inputs (dim {}) and targets (dim {}) need a first dimension that indexes items",
        inputs.dim(), targets.dim()));
  }
  if (inputs.size(0) != targets.size(0)) {
    throw DataError(fmt::format(
        "TensorDataset: inputs have {} items but targets have {}; they must agree on the first dimension",
        inputs.size(0), targets.size(0)));
  }
}

int64_t TensorDataset::size() const { return inputs.defined() ? inputs.size(0) : 0; }

Batch gather(const TensorDataset& dataset, const at::Tensor& indices) {
  TORCH_CHECK(indices.dim() == 1 && indices.scalar_type() == at::kLong,
              "gather: indices must be a 1-D int64 tensor, got ", indices.sizes(), " ",
              indices.scalar_type());
  // index_select copies into fresh contiguous tensors: the batch owns its
  // memory, so the consumer may modify it and the dataset stays untouched.
  return Batch{dataset.inputs.index_select(0, indices), dataset.targets.index_select(0, indices),
               indices};
}

}  // namespace paratrain::data

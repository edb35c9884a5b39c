// LARS and LAMB's norms in the megatron strategy: see megatron_layerwise.h.
#include "paratrain/train/strategies/megatron_layerwise.h"

#include <torch/torch.h>

#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train::strategies {

// Note [LARS and LAMB across tensor-parallel shards]
// A trust ratio is ||w|| / ||g|| (LARS; LAMB: ||w|| / ||r||) of the whole
// single-process tensor. This rank steps whole tp-local tensors (DDP over
// the replicas) or pieces of them (ZeRO-1/2, FSDP). One table per step,
// [tensors of this rank's module, k], takes each stepped tensor's sums of
// squares in its tensor's row; then
// - under ZeRO/FSDP it is summed over the replicas (disjoint pieces of the
//   same tp-local tensor; under DDP every replica holds the whole tensor and
//   nothing is summed);
// - the rows of tensors every tp rank holds whole (LayerNorms, biases of
//   row-parallel layers, wpe) are zeroed on tp ranks other than 0, and the
//   table is summed over tp: a split tensor's shards add up, a whole one
//   counts once.
// Every tp rank of a replica has the same module, so the rows agree. Under
// pp the trust ratios are per stage: a stage's tensors are all its own (a
// tied copy is stepped as the same tensor on both stages).
LayerwiseParams tensor_parallel_layerwise_params(
    const std::vector<std::pair<at::Tensor, std::string>>& stepped,
    const torch::OrderedDict<std::string, tensor_parallel::ShardSpec>& layout, comm::ProcessGroup* replicas,
    comm::ProcessGroup& tp, c10::Device device, std::chrono::milliseconds timeout) {
  std::map<std::string, int64_t> index;
  std::vector<bool> whole;  // by row: the same tensor on every tp rank
  for (const auto& item : layout) {
    index.emplace(item.key(), static_cast<int64_t>(index.size()));
    whole.push_back(item.value().replicated());
  }
  LayerwiseParams out;
  std::unordered_map<const void*, int64_t> row_of;
  for (const auto& [param, name] : stepped) {
    auto it = index.find(name);
    if (it == index.end())
      throw Error(fmt::format("LARS/LAMB under tensor parallelism: '{}' is not in the module's layout", name));
    out.full_dims.push_back(static_cast<int64_t>(layout[name].full_shape.size()));
    row_of[param.unsafeGetTensorImpl()] = it->second;
  }
  const auto rows = static_cast<int64_t>(index.size());
  // 1 for the rows counted on tp rank 0 only.
  at::Tensor keep = at::ones({rows, 1}, at::kDouble);
  for (int64_t r = 0; r < rows; ++r)
    if (whole[static_cast<size_t>(r)] && tp.rank() > 0) keep[r][0] = 0.0;
  keep = keep.to(device);
  out.norm_reducer = [row_of = std::move(row_of), rows, keep, replicas, &tp, device, timeout](
                         const std::vector<at::Tensor>& params, at::Tensor& sums) {
    std::vector<int64_t> at_row;
    at_row.reserve(params.size());
    for (const at::Tensor& p : params) {
      auto it = row_of.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(it != row_of.end(), "tensor_parallel_layerwise_params: an optimizer param has no tensor");
      at_row.push_back(it->second);
    }
    const at::Tensor index = at::tensor(at_row, at::TensorOptions().dtype(at::kLong)).to(device);
    at::Tensor table = at::zeros({rows, sums.size(1)}, sums.options().device(device));
    table.index_add_(0, index, sums.to(device));
    if (replicas != nullptr && replicas->size() > 1) replicas->all_reduce(table, comm::ReduceOp::kSum)->wait(timeout);
    if (tp.size() > 1) {
      table.mul_(keep);  // a whole tensor counts once
      tp.all_reduce(table, comm::ReduceOp::kSum)->wait(timeout);
    }
    sums.copy_(table.index_select(0, index));
  };
  return out;
}

}  // namespace paratrain::train::strategies

// Per-tensor norms for trust ratios, complete across shards; see layer_norms.h.
#include "paratrain/optim/layer_norms.h"

#include <ATen/ATen.h>

#include <cmath>
#include <unordered_map>

#include "paratrain/comm/process_group.h"

namespace paratrain::optim {

NormReducer sharded_norm_reducer(comm::ProcessGroup& group, const std::vector<std::pair<at::Tensor, int64_t>>& owners,
                                 int64_t num_tensors) {
  TORCH_CHECK(num_tensors >= 0, "sharded_norm_reducer: num_tensors must be >= 0, got ", num_tensors);
  std::unordered_map<const void*, int64_t> owner_of;
  for (const auto& [param, index] : owners) {
    TORCH_CHECK(index >= 0 && index < num_tensors, "sharded_norm_reducer: owner index ", index, " outside [0, ",
                num_tensors, ")");
    owner_of[param.unsafeGetTensorImpl()] = index;
  }
  return [&group, owner_of = std::move(owner_of), num_tensors](const std::vector<at::Tensor>& params,
                                                                at::Tensor& sums) {
    TORCH_CHECK(sums.dim() == 2 && sums.size(0) == static_cast<int64_t>(params.size()),
                "sharded_norm_reducer: sums must be [params, k]");
    std::vector<int64_t> rows;
    rows.reserve(params.size());
    for (const at::Tensor& p : params) {
      auto it = owner_of.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(it != owner_of.end(),
                  "sharded_norm_reducer: an optimizer param has no owner; build the reducer from the same params "
                  "the optimizer holds");
      rows.push_back(it->second);
    }
    const at::Tensor index = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(sums.device());
    // Pieces of one tensor on this rank (if any) add up here, pieces on other
    // ranks in the all-reduce: one collective for every tensor's norms.
    at::Tensor table = at::zeros({num_tensors, sums.size(1)}, sums.options());
    table.index_add_(0, index, sums);
    group.all_reduce(table, comm::ReduceOp::kSum)->wait();
    sums.copy_(table.index_select(0, index));
  };
}

std::vector<std::pair<double, double>> pairwise_norms(const std::vector<at::Tensor>& params,
                                                      const std::vector<at::Tensor>& firsts,
                                                      const std::vector<at::Tensor>& seconds,
                                                      const NormReducer& reducer) {
  TORCH_CHECK(params.size() == firsts.size() && params.size() == seconds.size(), "pairwise_norms: ", params.size(),
              " params but ", firsts.size(), " and ", seconds.size(), " tensors to measure");
  const int64_t n = static_cast<int64_t>(params.size());
  const at::Device device = n > 0 ? params[0].device() : at::Device(at::kCPU);
  at::Tensor sums = at::zeros({n, 2}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (int64_t i = 0; i < n; ++i) {
    // Square in the param's dtype, accumulate in float64 (at::sum with dtype
    // converts before reducing), so pieces summed in any grouping agree to
    // float64 rounding and the trust ratio does not depend on the sharding.
    if (firsts[i].defined()) sums[i][0] = at::sum(at::square(firsts[i]), at::kDouble);
    if (seconds[i].defined()) sums[i][1] = at::sum(at::square(seconds[i]), at::kDouble);
  }
  if (reducer) reducer(params, sums);
  // One transfer to the host per step: the ratios are scalars per tensor.
  const at::Tensor host = sums.to(at::kCPU).contiguous();
  const double* data = host.data_ptr<double>();
  std::vector<std::pair<double, double>> norms(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) norms[i] = {std::sqrt(data[2 * i]), std::sqrt(data[2 * i + 1])};
  return norms;
}

bool excluded_by_default(int64_t full_dim) { return full_dim <= 1; }

ParamSplit split_for_adaptation(const torch::OrderedDict<std::string, at::Tensor>& named) {
  ParamSplit split;
  for (const auto& item : named) {
    const bool excluded = excluded_by_default(item.value().dim());
    (excluded ? split.excluded : split.adapted).push_back(item.value());
    (excluded ? split.excluded_names : split.adapted_names).push_back(item.key());
  }
  return split;
}

ParamSplit split_for_adaptation(const std::vector<at::Tensor>& params, const std::vector<int64_t>& full_dims) {
  TORCH_CHECK(full_dims.empty() || full_dims.size() == params.size(), "split_for_adaptation: ", full_dims.size(),
              " full_dims for ", params.size(), " params");
  ParamSplit split;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t dim = full_dims.empty() ? params[i].dim() : full_dims[i];
    (excluded_by_default(dim) ? split.excluded : split.adapted).push_back(params[i]);
  }
  return split;
}

}  // namespace paratrain::optim

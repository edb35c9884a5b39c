// Per-tensor ("layer-wise") norms for the trust ratios of LARS and LAMB, and
// which tensors are excluded from the adaptation. Under ZeRO each optimizer
// param is only a piece of a full tensor, so a norm is a sum of squares over
// pieces on several ranks: NormReducer completes all of them with one
// all-reduce per step. Not here: the optimizers (lars.h, lamb.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace paratrain::comm {
class ProcessGroup;
}

namespace paratrain::optim {

// Completes per-tensor sums of squares in place. `sums` is [params.size(), k]
// (k quantities per param, e.g. ||w||^2 and ||g||^2), row i summed over the
// elements of params[i] this rank holds; afterwards row i must hold the sums
// over every element of the full tensor params[i] is a piece of. `params` are
// the optimizer's params in param-group order. Collective when sharded: every
// rank's optimizer calls it once per step, in step(), even with no params.
using NormReducer = std::function<void(const std::vector<at::Tensor>& params, at::Tensor& sums)>;

// The reducer for sharded optimizer params (ZeRO-1/2 pieces): owners maps each
// optimizer param of this rank to the index (in [0, num_tensors)) of the full
// tensor it is a piece of, e.g. {zero.optimizer_params()[k], zero.pieces()[k].param}.
// Each call scatters the rows into a [num_tensors, k] table, all-reduces it
// (sum) over `group` once, and reads the rows back. `group` must outlive the
// reducer; num_tensors must be equal on all ranks. A param not in `owners`
// is a caller mistake (TORCH_CHECK at the call).
NormReducer sharded_norm_reducer(comm::ProcessGroup& group, const std::vector<std::pair<at::Tensor, int64_t>>& owners,
                                 int64_t num_tensors);

// Two norms per optimizer param, as LARS (||w||, ||g||) and LAMB (||w||, ||r||)
// need them: result[i] = {||firsts[i]||, ||seconds[i]||}, an undefined tensor
// counting 0 (callers pass undefined for params that skip the trust ratio, to
// save the work). Sums of squares are accumulated in float64 on params[0]'s
// device, completed by `reducer` when set (once, for all params), then moved
// to the host in one transfer.
std::vector<std::pair<double, double>> pairwise_norms(const std::vector<at::Tensor>& params,
                                                      const std::vector<at::Tensor>& firsts,
                                                      const std::vector<at::Tensor>& seconds,
                                                      const NormReducer& reducer);

// The usual rule of LARS/LAMB practice (You et al.; Goyal et al. for weight
// decay): tensors with dim() <= 1 (biases, LayerNorm/BatchNorm weights) are
// excluded from the trust ratio (and usually from weight decay); matrices and
// convolution kernels are adapted.
bool excluded_by_default(int64_t full_dim);

struct ParamSplit {
  std::vector<at::Tensor> adapted;
  std::vector<at::Tensor> excluded;
  std::vector<std::string> adapted_names;   // empty when split without names
  std::vector<std::string> excluded_names;
};

// A module's named parameters (module->named_parameters()) split by
// excluded_by_default(dim), order kept within each part.
ParamSplit split_for_adaptation(const torch::OrderedDict<std::string, at::Tensor>& named);
// Unnamed params; full_dims[i] is the dim of the full tensor params[i] is a
// piece of (ZeRO pieces are flat 1-D views of matrices). Empty: the params'
// own dims.
ParamSplit split_for_adaptation(const std::vector<at::Tensor>& params, const std::vector<int64_t>& full_dims = {});

}  // namespace paratrain::optim

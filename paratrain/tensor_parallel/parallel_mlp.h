// The transformer MLP under tensor parallelism (Megatron-LM section 3):
// fc = ColumnParallelLinear(d -> hidden, each rank hidden/tp outputs), GELU on
// the local slice (elementwise, so no communication), proj =
// RowParallelLinear(hidden/tp -> d) whose partial sums are all-reduced once.
// One all-reduce in forward (proj), one in backward (fc's input gradient).
// Parameter names equal the single-process block's: fc.weight, fc.bias,
// proj.weight, proj.bias.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "paratrain/tensor_parallel/context.h"
#include "paratrain/tensor_parallel/layers.h"

namespace paratrain::tensor_parallel {

struct ParallelMlpOptions {
  int64_t d_model = 0;
  // Hidden width of the full MLP; 0 means 4 * d_model. Divisible by tp.
  int64_t hidden = 0;
  bool bias = true;
};

class ParallelMlpImpl : public torch::nn::Cloneable<ParallelMlpImpl> {
 public:
  // Initialized as the single-process layers built from the same RNG state
  // (every tp rank must be at the same state).
  ParallelMlpImpl(ParallelMlpOptions options, TpContext ctx);
  // Built from a single-process MLP's parameters, by name (fc.weight,
  // fc.bias, proj.weight, proj.bias); this rank keeps its shards.
  static std::shared_ptr<ParallelMlpImpl> from_full(const torch::OrderedDict<std::string, at::Tensor>& full,
                                                    ParallelMlpOptions options, TpContext ctx);
  void reset() override;
  // x: [..., d_model], replicated; returns [..., d_model], replicated.
  at::Tensor forward(const at::Tensor& x);

  ParallelMlpOptions options;
  TpContext ctx;
  ColumnParallelLinear fc{nullptr};
  RowParallelLinear proj{nullptr};
};
TORCH_MODULE(ParallelMlp);

}  // namespace paratrain::tensor_parallel

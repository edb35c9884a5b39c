// ParallelMlp: column-parallel fc, GELU, row-parallel proj. See parallel_mlp.h.
#include "paratrain/tensor_parallel/parallel_mlp.h"

#include <ATen/ATen.h>

#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/tensor_parallel/shards.h"

namespace paratrain::tensor_parallel {

ParallelMlpImpl::ParallelMlpImpl(ParallelMlpOptions options_, TpContext ctx_) : options(options_), ctx(ctx_) {
  if (options.hidden == 0) options.hidden = 4 * options.d_model;
  divide_evenly(options.hidden, ctx.size(), "MLP hidden width");
  reset();
}

std::shared_ptr<ParallelMlpImpl> ParallelMlpImpl::from_full(const torch::OrderedDict<std::string, at::Tensor>& full,
                                                            ParallelMlpOptions options, TpContext ctx) {
  auto mlp = std::make_shared<ParallelMlpImpl>(options, ctx);
  load_full_parameters(*mlp, full, ctx);
  return mlp;
}

void ParallelMlpImpl::reset() {
  ColumnParallelOptions c;
  c.in_features = options.d_model;
  c.out_features = options.hidden;
  c.bias = options.bias;
  fc = register_module("fc", ColumnParallelLinear(c, ctx));
  RowParallelOptions r;
  r.in_features = options.hidden;
  r.out_features = options.d_model;
  r.bias = options.bias;
  r.input_is_parallel = true;
  proj = register_module("proj", RowParallelLinear(r, ctx));
}

at::Tensor ParallelMlpImpl::forward(const at::Tensor& x) {
  // Exact (erf) GELU, torch's default, as the single-process block.
  return proj->forward(at::gelu(fc->forward(x)));
}

}  // namespace paratrain::tensor_parallel

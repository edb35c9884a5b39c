// Where paratrain's models run each Linear: the site of a tensor-parallel
// plan when the model is planned (parallelize/sites.h; the GPT's plan, or
// parallel.tp_plan for the MLP and CNN), else quantization's activation site
// (quant/activations.h, Note [Activation sites]). Internal to models/.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/linear.h>

#include "paratrain/parallelize/sites.h"
#include "paratrain/quant/activations.h"

namespace paratrain::models {

inline at::Tensor linear_site(torch::nn::LinearImpl& layer, const at::Tensor& x) {
  return parallelize::plan_context(layer) != nullptr ? parallelize::linear(layer, x) : quant::linear(layer, x);
}

}  // namespace paratrain::models

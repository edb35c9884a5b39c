// The "ps" strategy's view of a model's layers: which parameters each layer
// of the forward is the first to read. The forward's layer-wise pull waits
// for exactly those before the layer runs (Note [Pulling during the forward]
// in ps_strategy.cpp), and the buckets of key ranges are cut along them
// (Note [Parameter-server buckets] in param_server/bucket_plan.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "paratrain/models/model.h"

namespace paratrain::train::strategies {

// Per layer, the positions in `params` of the parameters it is the first to
// read (its modules' and the tied ones it `reads`); parameters no layer
// names go to the first layer. Empty when `layers` is.
std::vector<std::vector<int>> first_reads(const std::vector<models::Layer>& layers,
                                          const std::vector<at::Tensor>& params);

// The inverse: per parameter, the layer that first reads it; empty (each
// tensor its own bucket unit) when `first_reads` is.
std::vector<int> layer_of_param(const std::vector<std::vector<int>>& first_reads, size_t params);

}  // namespace paratrain::train::strategies

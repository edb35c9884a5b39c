// Pipeline partitioning: which contiguous layers form each model chunk
// (stages * virtual_stages chunks; chunk j runs on stage j % stages). Pure
// arithmetic on per-layer costs; building the stage modules from the bounds is
// the executor's job.
#pragma once

#include <cstdint>
#include <vector>

namespace paratrain::pipeline {

// Bounds of `chunks` contiguous chunks over the layers: chunk j holds layers
// [bounds[j], bounds[j+1]), bounds.front() == 0, bounds.back() == layer count.
// Minimises the largest chunk cost exactly (dynamic programming, O(chunks *
// layers^2)); every chunk gets at least one layer. Among the optimal
// partitions it takes the one with the smallest sum of squared chunk costs
// (the other chunks as even as possible too), then, chunk by chunk from the
// first, the one giving the earlier chunk more layers: uniform costs give
// [3, 3, 2, 2] for 10 layers in 4 chunks, so the later stages, which also
// hold the loss and the head, get the lighter share.
// Throws ConfigError naming parallel.pp / pipeline.virtual_stages and the
// layer count when chunks > layers or chunks < 1; TORCH_CHECK on a negative or
// non-finite cost (a caller's mistake).
// `chunk_scale` (empty = all 1): chunk j's cost is its layers' cost times
// chunk_scale[j] (pipeline.balance = "rank_speed": the seconds per unit of
// cost of the stage that runs chunk j, so a slower stage gets less).
std::vector<int> balanced_partition(const std::vector<double>& layer_costs, int chunks,
                                    const std::vector<double>& chunk_scale = {});

// The user's own split (config key pipeline.split, layers per chunk, e.g.
// [5, 3]) as bounds like balanced_partition's. Throws ConfigError naming
// pipeline.split when it has a number of entries other than `chunks`, an entry
// < 1, or a sum other than `num_layers` (the message says the layer count).
std::vector<int> explicit_partition(const std::vector<int64_t>& layers_per_chunk, int num_layers, int chunks);

// Largest chunk cost of `bounds` over `layer_costs` (to compare partitions).
double max_chunk_cost(const std::vector<double>& layer_costs, const std::vector<int>& bounds);

}  // namespace paratrain::pipeline

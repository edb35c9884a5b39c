// Random streams for dropout under tensor parallelism (Megatron-LM's scheme,
// arXiv 1909.08053 section 3, "model-parallel RNG"):
//
// - Outside tensor-parallel regions activations are replicated: every tp rank
//   holds the same tensor (residual stream, LayerNorm outputs, the output of a
//   row-parallel layer after its all-reduce). Dropout there must draw the same
//   mask on every tp rank, or the replicas diverge. It uses the ordinary
//   (default) generator, seeded identically on the ranks of a tp group, which
//   stays in step because the ranks make the same random calls in the same
//   order. That dropout equals the single-process model's given the same seed.
// - Inside a region each rank holds different data (its heads' attention
//   probabilities). Drawing those masks from the shared stream would give
//   every rank the same mask pattern for different heads (correlated dropout),
//   so each tp rank draws them from its own generator seeded with
//   base_seed + 2718 + tp_rank (Megatron's offset). These masks are not the
//   ones a single process would draw for the same heads (statistically the same
//   distribution, not the same values), so tests of equality with the
//   single-process model run with dropout 0 inside regions.
// Not here: seeding the default generator (the Trainer seeds it per run).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace paratrain::tensor_parallel {

inline constexpr uint64_t kRegionSeedOffset = 2718;

// The seed of tp rank `tp_rank`'s in-region dropout stream.
uint64_t region_seed(uint64_t base_seed, int tp_rank);

// A CPU generator for the in-region stream (the stream of masks drawn inside
// one rank's tensor-parallel regions).
at::Generator make_region_generator(uint64_t base_seed, int tp_rank);

// Inverted dropout drawing its mask from `generator` (torch's dropout takes
// no generator): x * mask / (1 - p) with mask ~ Bernoulli(1 - p). Identity
// when not training or p == 0.
at::Tensor dropout_with(const at::Tensor& x, double p, bool training, at::Generator& generator);

}  // namespace paratrain::tensor_parallel

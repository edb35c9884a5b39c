// Megatron sequence parallelism (Korthikanti et al., arXiv 2205.05198): the
// autograd-aware collectives along the sequence dimension inside the tensor-
// parallel group. Regions that tensor parallelism leaves replicated
// (LayerNorm, dropout, residual adds) run on a 1/tp slice of the sequence;
// the all-reduce that closes a row-parallel layer becomes a reduce-scatter
// into sequence chunks, and the input of a column-parallel layer is
// all-gathered from them (same bytes moved as the all-reduce it replaces).
// Not here: the column/row-parallel layers (tensor_parallel/), ring attention
// (ring_attention.h, its own cp axis).
//
//   SequenceParallelContext sp{.group = &tp};      // activations [B, S, d], S split
//   x = scatter_to_sequence_region(x, sp);          // [B, S/tp, d]  (once, after the embedding)
//   h = layer_norm(x);                              // on the chunk, weights replicated
//   h = gather_from_sequence_region(h, sp);         // [B, S, d] -> column-parallel linear ...
//   y = reduce_scatter_to_sequence_region(row_parallel_partial_sum, sp);  // [B, S/tp, d]
//   sync_sequence_parallel_grads(layer_norm->parameters(), sp);  // after backward
//
// Convention: the sequence is dimension `seq_dim` of the activations
// (default 1: [B, S, d]); rank r of the group holds positions
// [r * S/tp, (r+1) * S/tp). The collectives move contiguous first-dimension
// blocks, so a tensor whose seq_dim is not 0 is transposed to put it first
// and made contiguous (one copy each way); with seq_dim = 0 ([S, B, d], as
// Megatron-LM lays out activations) no copy is needed. Results are
// contiguous in the input's layout.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::sequence_parallel {

struct SequenceParallelContext {
  // The tensor-parallel group (not owned; must outlive every backward pass
  // of the tensors these functions return).
  comm::ProcessGroup* group = nullptr;
  // The sequence dimension of the activations; negative counts from the end.
  int64_t seq_dim = 1;
  // Bound on every collective's wait (forward and backward).
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

// Forward: this rank's chunk of the sequence (S -> S/tp; S must be divisible
// by tp, else Error). Backward: all-gather of the chunks' gradients.
at::Tensor scatter_to_sequence_region(const at::Tensor& input, const SequenceParallelContext& sp);

// Forward: all-gather of the chunks along the sequence (S/tp -> S).
// Backward: reduce-scatter (sum) of the gradient: the gathered tensor feeds
// a column-parallel layer on every rank, each contributing a partial
// gradient for the whole sequence, and each rank keeps its chunk's sum.
at::Tensor gather_from_sequence_region(const at::Tensor& input, const SequenceParallelContext& sp);

// Forward: reduce-scatter (sum) along the sequence (S -> S/tp): the partial
// sums of a row-parallel layer become this rank's chunk of their total.
// Backward: all-gather of the chunks' gradients.
at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& input, const SequenceParallelContext& sp);

// Parameters replicated across the group but used on sequence chunks only
// (LayerNorm weight and bias in a sequence-parallel region) get from each
// rank the gradient of its chunk; the full gradient is their sum. All-reduces
// (sum) the .grad() of `params` in place, all in one collective; a parameter
// without a gradient on this rank counts as zeros and gets the sum. Call after
// backward on every rank of the group with the same list in the same order.
void sync_sequence_parallel_grads(const std::vector<at::Tensor>& params, const SequenceParallelContext& sp);

}  // namespace paratrain::sequence_parallel

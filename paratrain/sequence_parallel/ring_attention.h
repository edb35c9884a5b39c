// Ring Self-Attention (Li et al., arXiv 2105.13120) with the exact online
// softmax of blockwise/ring attention (arXiv 2310.01889): the sequence is
// split into cp chunks, rank r of the cp group holds query, key and value of
// chunk r, and key/value chunks travel around the ring so each rank attends
// its queries to the whole sequence while holding only two key/value chunks
// and one [S/cp, S/cp] block of scores at a time.
// Not here: the per-block arithmetic (blockwise_attention.h), projections,
// heads or position embeddings (the model's attention block), dropout.
//
// A GPT attention block under cp calls it on its chunk's projections:
//   auto x   = sequence_chunk(tokens_embedded, /*dim=*/1, cp);   // [B, S/cp, d]
//   // positions of this chunk start at chunk_offset(S, cp.rank(), cp.size())
//   auto q = ..., k = ..., v = ...;                              // [B, H, S/cp, D]
//   auto y = ring_attention(q, k, v, cp, {.causal = true});       // [B, H, S/cp, D]
// Everything else in the model (embeddings, MLP, LayerNorm, the loss) runs on
// the chunk unchanged. Parameters are replicated over cp and each rank's
// gradient covers its chunk's tokens only: all-reduce them over the cp group
// after backward (a sum when each rank's loss is its share of the global
// loss, e.g. its tokens' loss sum / all tokens of the batch; an average when
// each rank's loss is the mean over its own tokens and chunks are equal).
//
// Attention dropout is not supported: the backward rebuilds each block's
// probabilities from the saved log-sum-exp, and a dropout mask would have to
// be regenerated per block from a per-(chunk, chunk) seed. Configurations
// with cp > 1 must use attention dropout 0 (the config layer should refuse
// it with a ConfigError); dropout outside attention is unaffected.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <optional>

#include "paratrain/comm/process_group.h"

namespace paratrain::sequence_parallel {

struct RingAttentionOptions {
  // Causal mask over the whole sequence: query position i sees keys 0..i.
  // Rank r then needs only key chunks 0..r; chunks after it are neither
  // computed nor sent (rank r does r + 1 blocks: later ranks do more work,
  // the usual load imbalance of contiguous chunks; a zig-zag layout would
  // even it out and is not implemented). false: every query sees every key.
  bool causal = true;
  // Multiplies q k^T before the softmax; nullopt: 1 / sqrt(head_dim).
  std::optional<double> scale;
  // Bound on every wait for a ring transfer (forward and backward).
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

// softmax(q k^T * scale + mask) v over the whole sequence for this rank's
// query chunk. q, k: [B, H, S/cp, D]; v: [B, H, S/cp, Dv]; all chunks the
// same length on every rank, rank r holding positions [r * S/cp, (r+1) * S/cp).
// Returns [B, H, S/cp, Dv] in q's dtype; the softmax runs in fp32.
// Differentiable: a custom autograd function whose backward passes key/value
// chunks around the ring again, together with their dK/dV accumulators, and
// saves only q, k, v, the output and the row log-sum-exp (never a score
// matrix). Every rank of `cp` must call it (and run backward) in the same
// order: it is a collective. The group must outlive the backward pass.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::ProcessGroup& cp,
                          const RingAttentionOptions& options = {});

// Throws Error (naming both numbers and what to do) unless seq_len is a
// positive multiple of cp_size: ring attention needs equal chunks.
void check_sequence_split(int64_t seq_len, int cp_size);

// Rank cp_rank's chunk of `full` along `dim` (a view): positions
// [chunk_offset, chunk_offset + seq_len / cp_size). Throws Error as
// check_sequence_split.
at::Tensor sequence_chunk(const at::Tensor& full, int64_t dim, int cp_rank, int cp_size);
inline at::Tensor sequence_chunk(const at::Tensor& full, int64_t dim, const comm::ProcessGroup& cp) {
  return sequence_chunk(full, dim, cp.rank(), cp.size());
}

// First sequence position held by cp_rank (for position embeddings).
int64_t chunk_offset(int64_t seq_len, int cp_rank, int cp_size);

}  // namespace paratrain::sequence_parallel

// Attention over one (query chunk, key/value chunk) block at a time: the
// online softmax that merges blocks exactly (forward) and the gradient of one
// block given the row log-sum-exp (backward). Pure tensor code, no
// communication: ring_attention.h moves the chunks between ranks and calls
// these. All arithmetic is fp32 whatever the inputs' dtype.
//
// Shapes: q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv]; row statistics
// [B, H, Sq]. See Note [Online softmax] in blockwise_attention.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace paratrain::sequence_parallel {

// Which entries of a block take part. Blocks that are masked out entirely
// (a key chunk after the query chunk under a causal mask) are never built:
// callers skip them.
enum class BlockMask {
  kNone,            // every query sees every key of the block
  kCausalDiagonal,  // query and key chunk are the same positions (Sq == Sk): query i sees keys 0..i
};

// The running state of softmax(q k^T * scale) v for one query chunk, fed one
// key/value block at a time in any order; after the last block output()
// equals attention over the concatenation of all blocks.
class OnlineSoftmax {
 public:
  // Adds one block. q, k, v may be any floating dtype; they are read as fp32.
  void add_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, BlockMask mask);

  bool empty() const { return !row_max_.defined(); }
  // sum_j exp(s_ij - m_i) v_j / sum_j exp(s_ij - m_i): [B, H, Sq, Dv], fp32.
  at::Tensor output() const;
  // m_i + log sum_j exp(s_ij - m_i) = log sum_j exp(s_ij): [B, H, Sq], fp32.
  // With it, backward rebuilds any block's probabilities without the others.
  at::Tensor log_sum_exp() const;

  // The running statistics themselves (tests and the negative control).
  const at::Tensor& row_max() const { return row_max_; }
  const at::Tensor& row_sum() const { return row_sum_; }
  const at::Tensor& accumulator() const { return acc_; }

 private:
  at::Tensor row_max_;  // m: [B, H, Sq], the largest score seen so far per row
  at::Tensor row_sum_;  // l: [B, H, Sq], sum of exp(s - m) over the blocks seen
  at::Tensor acc_;      // [B, H, Sq, Dv], sum of exp(s - m) v over the blocks seen
};

struct BlockGrads {
  at::Tensor dq;  // [B, H, Sq, D], fp32: this block's share of dL/dq
  at::Tensor dk;  // [B, H, Sk, D], fp32: this query chunk's share of dL/dk
  at::Tensor dv;  // [B, H, Sk, Dv], fp32
};

// Gradients through one block of attention. `lse` is the row log-sum-exp
// over *all* blocks (OnlineSoftmax::log_sum_exp of the forward) and
// `delta` = rowsum(dO * O) over the final output, both [B, H, Sq] fp32:
// with them P = exp(S - lse) is this block's slice of the full softmax and
// dS = P * (dP - delta) is exact without the other blocks.
BlockGrads attention_block_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& grad_out, const at::Tensor& lse, const at::Tensor& delta,
                                    double scale, BlockMask mask);

}  // namespace paratrain::sequence_parallel

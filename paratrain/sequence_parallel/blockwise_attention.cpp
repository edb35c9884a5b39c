// OnlineSoftmax and attention_block_backward: see blockwise_attention.h.
#include "paratrain/sequence_parallel/blockwise_attention.h"

#include <ATen/ATen.h>

#include <limits>

namespace paratrain::sequence_parallel {
namespace {

// Note [Online softmax]
// Softmax over a row split into blocks b = 1..n (FlashAttention, arXiv
// 2205.14135; blockwise/ring attention, arXiv 2310.01889): keep per row the
// largest score m seen so far, l = sum exp(s - m) and acc = sum exp(s - m) v.
// A new block with scores s_b and block maximum m_b gives m' = max(m, m_b) and
//   l'   = l   * exp(m - m') + sum exp(s_b - m')
//   acc' = acc * exp(m - m') + exp(s_b - m') v_b
// The factor exp(m - m') (the "rescale") moves what was summed under the old
// maximum to the new one; every exponent is <= 0, so nothing overflows
// however large the scores, and the result after the last block is exactly
// acc / l = softmax(s) v. Dropping the rescale is wrong as soon as a later
// block raises a row's maximum (tests/sequence_parallel prove the check
// catches it). lse = m + log l is all backward needs from the forward.

// The scores of one block in fp32, masked entries at -inf.
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, double scale, BlockMask mask) {
  at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)).mul_(scale);
  if (mask == BlockMask::kCausalDiagonal) {
    TORCH_CHECK(q.size(-2) == k.size(-2), "attention: a causal diagonal block needs query and key chunks of one "
                "length, got ", q.size(-2), " and ", k.size(-2));
    const int64_t n = q.size(-2);
    at::Tensor above = at::ones({n, n}, scores.options().dtype(at::kBool)).triu_(1);
    scores.masked_fill_(above, -std::numeric_limits<float>::infinity());
  }
  return scores;
}

}  // namespace

void OnlineSoftmax::add_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                              BlockMask mask) {
  at::Tensor p = block_scores(q, k, scale, mask);
  // Every row of a block we are given has at least one visible key (the
  // diagonal under a causal mask), so the block maximum is finite.
  at::Tensor block_max = std::get<0>(p.max(-1));
  at::Tensor new_max = empty() ? block_max : at::maximum(row_max_, block_max);
  p.sub_(new_max.unsqueeze(-1)).exp_();  // in place: one [Sq, Sk] block alive
  at::Tensor pv = at::matmul(p, v.to(at::kFloat));
  if (empty()) {
    row_sum_ = p.sum(-1);
    acc_ = std::move(pv);
  } else {
    at::Tensor rescale = (row_max_ - new_max).exp_();  // See Note [Online softmax]
    row_sum_ = row_sum_.mul_(rescale).add_(p.sum(-1));
    acc_ = acc_.mul_(rescale.unsqueeze(-1)).add_(pv);
  }
  row_max_ = std::move(new_max);
}

at::Tensor OnlineSoftmax::output() const {
  TORCH_CHECK(!empty(), "OnlineSoftmax::output: no block was added");
  return acc_ / row_sum_.unsqueeze(-1);
}

at::Tensor OnlineSoftmax::log_sum_exp() const {
  TORCH_CHECK(!empty(), "OnlineSoftmax::log_sum_exp: no block was added");
  return row_max_ + row_sum_.log();
}

// With P = softmax(S) over the full row, O = P V and dO given:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),
//   dQ = dS K * scale,  dK = dS^T Q * scale
// (rowsum(dP * P) = rowsum(dO * O) because O = P V). Each block's P is
// exp(S_block - lse): the full softmax restricted to the block, rebuilt from
// q, k and the saved lse instead of stored (FlashAttention-2's backward).
BlockGrads attention_block_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& grad_out, const at::Tensor& lse, const at::Tensor& delta,
                                    double scale, BlockMask mask) {
  const at::Tensor q32 = q.to(at::kFloat);
  const at::Tensor k32 = k.to(at::kFloat);
  const at::Tensor dout = grad_out.to(at::kFloat);
  at::Tensor p = block_scores(q32, k32, scale, mask);
  p.sub_(lse.unsqueeze(-1)).exp_();  // masked: exp(-inf) = 0
  BlockGrads g;
  g.dv = at::matmul(p.transpose(-2, -1), dout);
  at::Tensor ds = at::matmul(dout, v.to(at::kFloat).transpose(-2, -1));  // dP
  ds.sub_(delta.unsqueeze(-1)).mul_(p);
  g.dq = at::matmul(ds, k32).mul_(scale);
  g.dk = at::matmul(ds.transpose(-2, -1), q32).mul_(scale);
  return g;
}

}  // namespace paratrain::sequence_parallel

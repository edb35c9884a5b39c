// The four autograd-aware communication mappings of Megatron-LM (arXiv
// 1909.08053, section 3) from which every tensor-parallel layer is built.
// Each is a forward/backward pair of conjugate operations:
//
//   mapping              forward                          backward
//   copy_to_region       identity                         all-reduce (sum)
//   reduce_from_region   all-reduce (sum)                 identity
//   scatter_to_region    split the last dim, keep own     all-gather the last dim
//   gather_from_region   all-gather the last dim          split, keep own chunk
//
// ("f" and "g" in the paper are copy_to_region and reduce_from_region.)
// Every rank of ctx.group must call the same mappings in the same order, in
// forward and in backward: each is a collective. With a group of size 1 they
// are all identities and do not communicate.
// Not here: the layers (layers.h), the sequence-parallel mappings
// (sequence_parallel/).
#pragma once

#include <ATen/core/Tensor.h>

#include "paratrain/tensor_parallel/context.h"

namespace paratrain::tensor_parallel {

// Enters a tensor-parallel region: every rank uses the same (replicated) x;
// the gradients each rank computes for it are partial sums over its shard of
// the layer, so backward all-reduces them.
at::Tensor copy_to_region(const at::Tensor& x, const TpContext& ctx);

// Leaves a tensor-parallel region: each rank holds a partial sum (row-parallel
// output); forward all-reduces it, backward passes the (replicated) gradient.
at::Tensor reduce_from_region(const at::Tensor& x, const TpContext& ctx);

// x is replicated; keeps this rank's chunk of the last dimension (which must
// be divisible by the group size). Backward all-gathers the chunks' gradients.
at::Tensor scatter_to_region(const at::Tensor& x, const TpContext& ctx);

// x is this rank's chunk of the last dimension; returns the concatenation of
// all ranks' chunks in rank order. Backward keeps this rank's chunk of the
// gradient (the gradient of a replicated value is the same on every rank).
at::Tensor gather_from_region(const at::Tensor& x, const TpContext& ctx);

// The plain (non-autograd) collectives the mappings use, for layers and
// tests: the sum over ranks of x, and the concatenation along the last
// dimension of every rank's x.
at::Tensor all_reduce_sum(const at::Tensor& x, const TpContext& ctx);
at::Tensor all_gather_last_dim(const at::Tensor& x, const TpContext& ctx);
at::Tensor split_last_dim(const at::Tensor& x, const TpContext& ctx);

}  // namespace paratrain::tensor_parallel

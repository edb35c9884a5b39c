// The collectives of the shm backend as plain functions over a mapped
// segment: each runs on the calling thread (the group's worker), moves the
// tensors chunk by chunk through the ranks' slots and synchronizes with the
// segment's phase barrier. No queueing, no Work: that is shm_group.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/comm/shm/shm_segment.h"
#include "paratrain/comm/shm/shm_symmetric.h"

namespace paratrain::comm::shm_detail {

// What every collective needs: the segment, the chunk counter (which half of
// each slot the next chunk uses; advanced identically on every rank because
// every rank runs the same operations on the same sizes) and the wait context.
struct Channel {
  Segment& seg;
  uint64_t& chunk;
  const WaitContext& ctx;
};

// Reduces `tensor` over the ranks in place; only ranks with copy_out get the
// result (reduce() to a root passes copy_out on the root alone).
void all_reduce(Channel ch, at::Tensor& tensor, ReduceOp op, bool copy_out);
// all_reduce of a tensor that is this rank's copy in `block` at `offset`
// (bytes), the same offset on every rank: reduced in place from the peers'
// copies, no copy through the slots. Same bits as all_reduce(). See Note
// [Reducing in place].
void all_reduce_symmetric(Channel ch, const SymmetricBlock& block, std::size_t offset, at::Tensor& tensor,
                          ReduceOp op);
void reduce_scatter(Channel ch, at::Tensor& output, const at::Tensor& input, ReduceOp op);
// counts: elements per rank (all_gather: all equal). copy_out false: this
// rank only contributes (gather to another root).
void all_gather(Channel ch, at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                bool copy_out);
void broadcast(Channel ch, at::Tensor& tensor, int root);
void scatter(Channel ch, at::Tensor& output, const at::Tensor& input, int root);
void barrier(Channel ch);

// True when the shm reduction supports the dtype (floating and integer types).
bool reducible(at::ScalarType type);

}  // namespace paratrain::comm::shm_detail

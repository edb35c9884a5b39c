// The shm collectives; see shm_collectives.h and Note [Shm phases].
#include "paratrain/comm/shm/shm_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::comm::shm_detail {
namespace {

char* bytes(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

at::Tensor view(char* p, int64_t n, at::ScalarType type) {
  return at::from_blob(p, {n}, at::TensorOptions().dtype(type));
}

bool sixteen_bit(at::ScalarType type) { return type == at::kHalf || type == at::kBFloat16; }

void combine(at::Tensor& acc, const at::Tensor& x, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: acc.add_(x); break;
    case ReduceOp::kMax: at::maximum_out(acc, acc, x); break;
    case ReduceOp::kMin: at::minimum_out(acc, acc, x); break;
  }
}

// dst[i] = op over r of srcs[r][i], in rank order so every element has one
// fixed summation order whichever rank computes it. 16-bit floats are
// summed in fp32 and rounded once (the reduction of n bf16 values would
// otherwise round n - 1 times). AVG divides before that rounding too.
void reduce_into(char* dst, const std::vector<const char*>& srcs, int64_t n, at::ScalarType type, ReduceOp op) {
  if (n == 0) return;
  const int world = static_cast<int>(srcs.size());
  auto src = [&](int r) { return view(const_cast<char*>(srcs[r]), n, type); };
  at::Tensor out = view(dst, n, type);
  if (sixteen_bit(type)) {
    at::Tensor acc = src(0).to(at::kFloat);
    for (int r = 1; r < world; ++r) combine(acc, src(r).to(at::kFloat), op);
    if (op == ReduceOp::kAvg) acc.div_(world);
    out.copy_(acc);
    return;
  }
  if (dst != srcs[0]) std::memcpy(dst, srcs[0], n * at::elementSize(type));
  for (int r = 1; r < world; ++r) combine(out, src(r), op);
  if (op == ReduceOp::kAvg) out.div_(world);
}

int64_t clamp_len(int64_t count, int64_t off, int64_t per) { return std::clamp<int64_t>(count - off, 0, per); }

std::string describe(const Segment::OpShape& s) {
  if (s.block == 0) return fmt::format("{} bytes through the group's slots", s.bytes);
  return fmt::format("{} bytes at offset {} of symmetric block {}", s.bytes, s.offset, s.block);
}

// After the operation's first phase: every peer published the same shape
// (Segment::OpShape), or this rank fails naming the first that did not.
void check_same_shape(Channel ch, const Segment::OpShape& mine) {
  for (int r = 0; r < ch.seg.size(); ++r) {
    if (r == ch.seg.rank()) continue;
    const auto theirs = ch.seg.shape_of(r);
    if (!(theirs == mine))
      throw CommError(fmt::format("{}: rank {} reduces {}, this rank {}. Every rank must all_reduce the same "
                                  "number of elements, and a tensor from allocate_symmetric() on every rank (the "
                                  "same piece of the same allocation) or on none",
                                  *ch.ctx.what, r, describe(theirs), describe(mine)));
  }
}

}  // namespace

bool reducible(at::ScalarType type) {
  return at::isFloatingType(type) || (at::isIntegralType(type, /*includeBool=*/false));
}

// Per chunk: copy in | phase | reduce my sub-slice into rank 0's slot | phase
// | copy out. Each rank reduces len/size elements, so the reduction's memory
// traffic is spread over the ranks (reduce-scatter), and the copy out of the
// complete chunk is the all-gather.
void all_reduce(Channel ch, at::Tensor& tensor, ReduceOp op, bool copy_out) {
  const auto type = tensor.scalar_type();
  const int64_t es = tensor.element_size(), n = tensor.numel();
  const int64_t per = static_cast<int64_t>(ch.seg.chunk_bytes()) / es;
  const int me = ch.seg.rank(), world = ch.seg.size();
  const Segment::OpShape shape{0, 0, static_cast<uint64_t>(n * es)};
  ch.seg.publish(shape);
  for (int64_t off = 0; off < n; off += per) {
    const int64_t len = std::min(per, n - off);
    const uint64_t c = ch.chunk++;
    std::memcpy(ch.seg.slot(me, c), bytes(tensor) + off * es, len * es);
    ch.seg.arrive_and_wait(ch.ctx);
    if (off == 0) check_same_shape(ch, shape);
    const int64_t lo = len * me / world, hi = len * (me + 1) / world;
    std::vector<const char*> srcs;
    for (int r = 0; r < world; ++r) srcs.push_back(ch.seg.slot(r, c) + lo * es);
    reduce_into(ch.seg.slot(0, c) + lo * es, srcs, hi - lo, type, op);
    ch.seg.arrive_and_wait(ch.ctx);
    if (copy_out) std::memcpy(bytes(tensor) + off * es, ch.seg.slot(0, c), len * es);
  }
}

// Note [Reducing in place]: every rank's tensor is its copy in a symmetric
// block, mapped by all ranks, so no rank copies its input anywhere:
//   phase (every copy holds its rank's input) | rank r reduces slice r of
//   every copy into slice r of its own | phase | each rank copies the other
//   slices from their reducers' copies | phase (nobody reads my copy any more,
//   so my caller may write it again: the next backward's gradients).
// Per rank that is one read of the tensor, n/world writes for the reduction
// and (world-1)/world of a copy, against the slot path's copy in, reduction
// and copy out of the whole tensor. Rank r writes only its own copy, and only
// slice r during the reduction, which no peer reads then. The summation order
// is the slot path's (rank order): rank 0 accumulates into its own slice,
// rank 1 starts with copy 1 + copy 0 (float addition is commutative), later
// ranks sum into a scratch half of their slot first (their own slice is an
// input of the sum), so both paths give the same bits.
void all_reduce_symmetric(Channel ch, const SymmetricBlock& block, std::size_t offset, at::Tensor& tensor,
                          ReduceOp op) {
  const auto type = tensor.scalar_type();
  const int64_t es = tensor.element_size(), n = tensor.numel();
  const int me = ch.seg.rank(), world = ch.seg.size();
  const Segment::OpShape shape{block.id(), offset, static_cast<uint64_t>(n * es)};
  ch.seg.publish(shape);
  ch.seg.arrive_and_wait(ch.ctx);
  check_same_shape(ch, shape);
  auto at_rank = [&](int r) { return block.copy_of(r) + offset; };
  const auto slice = [&](int r) { return std::pair<int64_t, int64_t>{n * r / world, n * (r + 1) / world}; };
  {
    const auto [lo, hi] = slice(me);
    std::vector<const char*> srcs;
    for (int r = 0; r < world; ++r) srcs.push_back(at_rank(r) + lo * es);
    char* dst = at_rank(me) + lo * es;
    if (me <= 1 || sixteen_bit(type)) {
      // In place: dst is srcs[0] after the swap, and the 16-bit path sums
      // into a temporary before writing dst.
      if (me == 1) std::swap(srcs[0], srcs[1]);
      reduce_into(dst, srcs, hi - lo, type, op);
    } else {
      // Both halves of this rank's slot are free: the first phase passed
      // after every peer finished every earlier operation, and nobody reads
      // this rank's slot during this one.
      const int64_t per = static_cast<int64_t>(ch.seg.chunk_bytes()) * 2 / es;
      char* scratch = ch.seg.slot(me, 0);
      for (int64_t off = 0; off < hi - lo; off += per) {
        const int64_t len = std::min(per, hi - lo - off);
        std::vector<const char*> part;
        for (auto* p : srcs) part.push_back(p + off * es);
        reduce_into(scratch, part, len, type, op);
        std::memcpy(dst + off * es, scratch, len * es);
      }
    }
  }
  ch.seg.arrive_and_wait(ch.ctx);
  for (int r = 0; r < world; ++r) {
    if (r == me) continue;
    const auto [lo, hi] = slice(r);
    std::memcpy(at_rank(me) + lo * es, at_rank(r) + lo * es, (hi - lo) * es);
  }
  ch.seg.arrive_and_wait(ch.ctx);
}

// Per chunk of `per` elements of every rank's output: each rank lays the
// matching piece of all `world` blocks of its input side by side in its
// slot | phase | rank r reduces piece r of every slot into its output.
void reduce_scatter(Channel ch, at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const auto type = input.scalar_type();
  const int me = ch.seg.rank(), world = ch.seg.size();
  const int64_t es = input.element_size(), m = output.numel();
  const int64_t per = static_cast<int64_t>(ch.seg.chunk_bytes()) / es / world;
  for (int64_t off = 0; off < m; off += per) {
    const int64_t len = std::min(per, m - off);
    const uint64_t c = ch.chunk++;
    for (int j = 0; j < world; ++j)
      std::memcpy(ch.seg.slot(me, c) + j * len * es, bytes(input) + (j * m + off) * es, len * es);
    ch.seg.arrive_and_wait(ch.ctx);
    std::vector<const char*> srcs;
    for (int r = 0; r < world; ++r) srcs.push_back(ch.seg.slot(r, c) + me * len * es);
    reduce_into(bytes(output) + off * es, srcs, len, type, op);
  }
}

// Per chunk: each rank copies its next piece in | phase | every rank (or
// only the root) copies every rank's piece out. Uneven counts: a rank whose
// share ran out contributes nothing to the later chunks.
void all_gather(Channel ch, at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                bool copy_out) {
  const int me = ch.seg.rank(), world = ch.seg.size();
  const int64_t es = input.element_size();
  const int64_t per = static_cast<int64_t>(ch.seg.chunk_bytes()) / es;
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> displ(world, 0);
  for (int r = 1; r < world; ++r) displ[r] = displ[r - 1] + counts[r - 1];
  for (int64_t off = 0; off < longest; off += per) {
    const uint64_t c = ch.chunk++;
    std::memcpy(ch.seg.slot(me, c), bytes(input) + off * es, clamp_len(counts[me], off, per) * es);
    ch.seg.arrive_and_wait(ch.ctx);
    if (!copy_out) continue;
    for (int r = 0; r < world; ++r)
      std::memcpy(bytes(output) + (displ[r] + off) * es, ch.seg.slot(r, c), clamp_len(counts[r], off, per) * es);
  }
}

void broadcast(Channel ch, at::Tensor& tensor, int root) {
  const int me = ch.seg.rank();
  const int64_t es = tensor.element_size(), n = tensor.numel();
  const int64_t per = static_cast<int64_t>(ch.seg.chunk_bytes()) / es;
  for (int64_t off = 0; off < n; off += per) {
    const int64_t len = std::min(per, n - off);
    const uint64_t c = ch.chunk++;
    if (me == root) std::memcpy(ch.seg.slot(root, c), bytes(tensor) + off * es, len * es);
    ch.seg.arrive_and_wait(ch.ctx);
    if (me != root) std::memcpy(bytes(tensor) + off * es, ch.seg.slot(root, c), len * es);
  }
}

// The root lays piece `off..off+len` of every rank's block side by side in
// its slot | phase | each rank copies its own piece out.
void scatter(Channel ch, at::Tensor& output, const at::Tensor& input, int root) {
  const int me = ch.seg.rank(), world = ch.seg.size();
  const int64_t es = output.element_size(), m = output.numel();
  const int64_t per = static_cast<int64_t>(ch.seg.chunk_bytes()) / es / world;
  for (int64_t off = 0; off < m; off += per) {
    const int64_t len = std::min(per, m - off);
    const uint64_t c = ch.chunk++;
    if (me == root)
      for (int j = 0; j < world; ++j)
        std::memcpy(ch.seg.slot(root, c) + j * len * es, bytes(input) + (j * m + off) * es, len * es);
    ch.seg.arrive_and_wait(ch.ctx);
    std::memcpy(bytes(output) + off * es, ch.seg.slot(root, c) + me * len * es, len * es);
  }
}

void barrier(Channel ch) { ch.seg.arrive_and_wait(ch.ctx); }

}  // namespace paratrain::comm::shm_detail

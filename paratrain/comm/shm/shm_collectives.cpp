// The shm collectives; see shm_collectives.h and Note [Shm phases].
#include "paratrain/comm/shm/shm_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

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
  for (int64_t off = 0; off < n; off += per) {
    const int64_t len = std::min(per, n - off);
    const uint64_t c = ch.chunk++;
    std::memcpy(ch.seg.slot(me, c), bytes(tensor) + off * es, len * es);
    ch.seg.arrive_and_wait(ch.ctx);
    const int64_t lo = len * me / world, hi = len * (me + 1) / world;
    std::vector<const char*> srcs;
    for (int r = 0; r < world; ++r) srcs.push_back(ch.seg.slot(r, c) + lo * es);
    reduce_into(ch.seg.slot(0, c) + lo * es, srcs, hi - lo, type, op);
    ch.seg.arrive_and_wait(ch.ctx);
    if (copy_out) std::memcpy(bytes(tensor) + off * es, ch.seg.slot(0, c), len * es);
  }
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

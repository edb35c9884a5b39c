// The int8 gradient wire (ddp.compression = "int8"): a sum all-reduce and a
// sum reduce-scatter whose payload crosses the wire as 8-bit integers with a
// float scale per block, added in fp32, with error feedback.
//
// Note [The int8 gradient wire]
// Phase 1: this rank's buffer plus its residual (what its last quantization
// dropped) is cut into p slices (slice j for rank j), each padded to whole
// blocks of `block` elements; every block is quantized symmetrically to int8
// with its own scale max|x| / 127 (quant/quantize.h: Note [Symmetric
// quantization]), and the residual becomes x - dequantized(x). One all-to-all
// sends each slice's bytes and scales to its owner, who dequantizes the p
// copies and adds them in fp32 (no integer overflow, whatever p).
// Phase 2 (all-reduce only): the owner adds its own residual of the sum,
// quantizes its slice again the same way, keeps what that dropped, and one
// all-gather hands every rank every slice; all ranks dequantize the same
// bytes, so replicas stay bitwise equal. The reduce-scatter stops after phase
// 1 and leaves the fp32 sum of this rank's slice (ZeRO-2's shard).
//
// Bytes: each rank sends (p-1)/p of the buffer once per phase at 1 byte per
// element plus 4 bytes per block of scales, against 4 bytes per element
// twice for a ring all-reduce: (1 + 4/block) / 4 of fp32, 0.2539 at the
// default block of 256.
//
// Why the residuals make it exact in the long run (1-bit Adam, arXiv
// 2102.02888, keeps the same two errors, "worker" and "server"): with rank
// r's buffer x_t^r, c_t^r = Q(x_t^r + e_{t-1}^r) sent and a_t =
// Q(sum_r c_t^r + E_{t-1}) applied, the results over T calls telescope to
//   sum_t a_t = sum_t sum_r x_t^r - sum_r e_T^r - E_T,
// so they never stray from the true sums by more than the last call's
// residuals, each within half a quantization step (|e| <= s / 2 with s its
// block's scale). Without feedback each call's rounding is lost for good,
// and a component under half its block's step is never sent at all. (DDP's
// buckets are divided by p before the call, so the sums are averages.)
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "paratrain/comm/process_group.h"

namespace paratrain::ddp {

/// The default block: elements that share one fp32 scale.
inline constexpr int64_t kInt8WireBlock = 256;

/// The error-feedback state of one buffer, updated in place by the
/// collectives below (float32, on the buffer's device). An undefined tensor
/// turns that feedback off.
struct Int8Residuals {
  /// [buffer numel]: what this rank's phase-1 quantization dropped, laid out
  /// as the buffer; added to the next call's buffer before quantizing.
  at::Tensor sent;
  /// [int8_slice_numel(numel, p)]: what re-quantizing this rank's slice of
  /// the sum dropped (all-reduce only); element i is buffer element
  /// rank * slice + i.
  at::Tensor summed;
};

/// Buffers one call's phases fill (the wire's bytes, the fp32 sums), kept
/// for the next call on a buffer of the same size: a bucket's call leaves
/// it to the next. Not shared by calls in flight at once.
struct Int8Scratch {
  at::Tensor x, send, recv, mine, slice, gathered;
};

/// Elements of each rank's slice of a `numel`-element buffer over p ranks:
/// ceil(numel / p).
int64_t int8_slice_numel(int64_t numel, int p);

/// Bytes one rank hands to the wire per phase for a `numel`-element buffer
/// over p ranks (its p - 1 slices for the others, payload and scales).
int64_t int8_wire_bytes_per_phase(int64_t numel, int p, int64_t block = kInt8WireBlock);

/// Starts the sum of `buffer` (contiguous, floating point) over `group` as in
/// Note [The int8 gradient wire]; `buffer` holds the sum once the work is
/// done. `residuals` (tensors shared, updated in place when each phase
/// starts) may be empty. The second phase goes to `gather_group` (same
/// members; Note [Second phases on their own group] in compress_hook.h).
/// `scratch` (may be null) is reused and kept by the work until it is done.
comm::WorkHandle all_reduce_int8(comm::ProcessGroup& group, at::Tensor& buffer, Int8Residuals residuals,
                                 comm::ProcessGroup& gather_group, int64_t block = kInt8WireBlock,
                                 std::shared_ptr<Int8Scratch> scratch = nullptr);

/// Phase 1 alone, as a sum reduce-scatter: `input` (p x output.numel()
/// elements) crosses the wire as int8 blocks and `output` receives the fp32
/// sum of this rank's slice. `sent` is input-shaped error feedback
/// (undefined: none).
comm::WorkHandle reduce_scatter_int8(comm::ProcessGroup& group, at::Tensor& output, const at::Tensor& input,
                                     at::Tensor sent, int64_t block = kInt8WireBlock,
                                     std::shared_ptr<Int8Scratch> scratch = nullptr);

}  // namespace paratrain::ddp

// A sum all-reduce that sends 16-bit floats and adds in fp32: the buffer is
// rounded to `wire` (bf16 or fp16), each rank receives every rank's copy of
// its 1/p slice (all-to-all), adds them in fp32, rounds the slice to `wire`
// again and all-gathers it; the buffer then holds the sum, widened back to
// its own dtype. Bytes on the wire are those of a 16-bit ring all-reduce
// (half of fp32), while the accumulation keeps fp32's precision: a 16-bit
// all-reduce adds in 16 bits, so p small contributions next to a large one
// can vanish one by one (1 + 2^-8 + 2^-8 is 1 in bf16 summed left to right,
// 1 + 2^-7 here).
//
// Also how a bf16 buffer is all-reduced over a backend without bf16 kernels
// (Debian's Gloo): the 16-bit payload travels as bytes, so only byte
// all-to-all and all-gather are needed.
//
// Every rank's result is bitwise the same (they all widen the same gathered
// bits), so replicas stay identical. Not here: choosing when to use it (DDP's
// comm hook, data_parallel/ddp/compress_hook.h).
#pragma once

#include <ATen/ATen.h>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

// Starts the reduction of `buffer` (contiguous, floating point, any length)
// and returns it in flight; `buffer` holds the sum once wait() returns. The
// second phase (fp32 sum, all-gather) starts when a poll (is_completed) or
// wait() finds the first one done, on `gather_group` when given (same
// members as `group`): needed when several calls are in flight, whose second
// phases would otherwise interleave with later first phases in a different
// order on each rank (see Note [Second phases on their own group] in
// data_parallel/ddp/compress_hook.h). `wire` is at::kBFloat16 or at::kHalf;
// anything else throws Error.
WorkHandle all_reduce_low_precision(ProcessGroup& group, at::Tensor& buffer, at::ScalarType wire,
                                    ProcessGroup* gather_group = nullptr);

// The first half alone, as a sum reduce-scatter: `input` (p x output.numel()
// elements) crosses the wire as `wire` (all-to-all of 16-bit bytes) and
// `output` receives the fp32 sum of every rank's slice for this rank, in
// output's dtype: not rounded to 16 bits again, since nothing is gathered.
// One collective, so calls in flight need no second group. ZeRO-2's
// compressed gradient reduce-scatter (zero/reduce_scatter_sink.h).
WorkHandle reduce_scatter_low_precision(ProcessGroup& group, at::Tensor& output, const at::Tensor& input,
                                        at::ScalarType wire);

}  // namespace paratrain::comm

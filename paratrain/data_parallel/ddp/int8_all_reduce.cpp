// The int8 gradient wire: see int8_all_reduce.h and Note [The int8 gradient
// wire] there.
#include "paratrain/data_parallel/ddp/int8_all_reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "paratrain/comm/two_phase_work.h"
#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

// How a buffer of `numel` elements travels over p ranks: p rows (slices) of
// `slice` elements, each padded to `blocks` whole blocks.
struct WireLayout {
  int64_t p = 1, numel = 0, slice = 0, block = kInt8WireBlock, blocks = 0;

  WireLayout(int64_t p_, int64_t numel_, int64_t slice_, int64_t block_)
      : p(p_), numel(numel_), slice(slice_), block(block_), blocks((slice_ + block_ - 1) / block_) {}
  int64_t padded() const { return blocks * block; }       ///< elements per row on the wire
  int64_t row_bytes() const { return padded() + blocks * 4; }  ///< int8 payload + fp32 scales
};

// Note [Two int8 codecs]: on the CPU each phase is one or two passes over
// raw memory into buffers kept from call to call (an ATen expression per
// step made the MLP's int8 wire slower than fp32 on both backends: a dozen
// temporaries per bucket, each a fresh mmap whose pages fault in); device
// tensors take the ATen expressions. Both follow Note [Symmetric
// quantization] (scale max|x| / 127, 1 for an all-zero block; round half to
// even; clamp to [-127, 127]).

// Round half to even by adding and removing 1.5 * 2^23 (exact for |v| <
// 2^22, here <= 127): std::nearbyint is a libm call per element on the
// baseline x86-64 target.
inline float round_even(float v) {
  constexpr float kRound = 12582912.0f;
  return (v + kRound) - kRound;
}

// Max |x| over n floats, with 8 independent maxima (one chain of maxss is
// latency-bound; NaN-strict max does not vectorize by itself). NaN when a
// value is not finite: `probe` accumulates x * 0, which is 0 for finite x
// and NaN for inf and NaN.
float max_abs(const float* x, int64_t n) {
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float probe = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      m[k] = std::max(m[k], std::fabs(x[i + k]));
      probe += x[i + k] * 0.0f;
    }
  for (; i < n; ++i) {
    m[0] = std::max(m[0], std::fabs(x[i]));
    probe += x[i] * 0.0f;
  }
  for (int k = 1; k < 8; ++k) m[0] = std::max(m[0], m[k]);
  return probe == 0 ? m[0] : std::numeric_limits<float>::quiet_NaN();
}

// Note [Non-finite blocks on the int8 wire]
// A block holding an inf or a NaN (an overflowed gradient) goes on the wire
// as zeros with a NaN scale, so it decodes to NaN on every rank: the sum is
// not finite wherever the input was not, as with an fp32 all-reduce, and
// the loss scaler's check (or the user) sees it. Its residual is set to zero
// rather than to NaN, so one bad step does not poison the steps after it or
// the checkpoints.

// CPU: `rows` rows of `w.slice` floats at `x` to wire rows at `out` (int8
// values, zero padding, then the scales). With `residual`, element e of x
// (e < residual_len) leaves x[e] - dequantized there.
void cpu_encode(const float* x, int64_t rows, const WireLayout& w, uint8_t* out, float* residual,
                int64_t residual_len) {
  for (int64_t i = 0; i < rows; ++i) {
    uint8_t* row = out + i * w.row_bytes();
    int8_t* q = reinterpret_cast<int8_t*>(row);
    std::memset(row + w.slice, 0, static_cast<std::size_t>(w.padded() - w.slice));
    for (int64_t b = 0; b < w.blocks; ++b) {
      const int64_t begin = b * w.block, n = std::min(w.block, w.slice - begin);
      const float* xb = x + i * w.slice + begin;
      const float max = max_abs(xb, n);
      const int64_t e0 = i * w.slice + begin, m = residual ? std::min(n, residual_len - e0) : 0;
      if (std::isnan(max)) {  // Note [Non-finite blocks on the int8 wire]
        std::memset(q + begin, 0, static_cast<std::size_t>(n));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(row + w.padded() + 4 * b, &nan, 4);
        for (int64_t j = 0; j < m; ++j) residual[e0 + j] = 0;
        continue;
      }
      const float s = max > 0 ? max / 127.0f : 1.0f;
      for (int64_t j = 0; j < n; ++j) q[begin + j] = static_cast<int8_t>(std::clamp(round_even(xb[j] / s), -127.0f, 127.0f));
      std::memcpy(row + w.padded() + 4 * b, &s, 4);
      for (int64_t j = 0; j < m; ++j) residual[e0 + j] = xb[j] - static_cast<float>(q[begin + j]) * s;
    }
  }
}

// CPU: wire rows back to floats: row i to out[i * slice ...] (only the first
// `limit` elements overall), or with `sum` all rows added into out[0, slice)
// in row order.
void cpu_decode(const uint8_t* in, int64_t rows, const WireLayout& w, float* out, bool sum, int64_t limit) {
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* row = in + i * w.row_bytes();
    const int8_t* q = reinterpret_cast<const int8_t*>(row);
    float* y = sum ? out : out + i * w.slice;
    const int64_t end_row = sum ? w.slice : std::min(w.slice, limit - i * w.slice);
    for (int64_t b = 0; b < w.blocks; ++b) {
      float s;
      std::memcpy(&s, row + w.padded() + 4 * b, 4);
      const int64_t begin = b * w.block, end = std::min(begin + w.block, end_row);
      if (sum && i > 0) {
        for (int64_t j = begin; j < end; ++j) y[j] += static_cast<float>(q[j]) * s;
      } else {
        for (int64_t j = begin; j < end; ++j) y[j] = static_cast<float>(q[j]) * s;
      }
    }
  }
}

// Device tensors: `rows` ([r, slice] float) to wire rows; rows becomes what
// the bytes stand for (NaN in a non-finite block: Note [Non-finite blocks on
// the int8 wire]; the caller zeroes those residuals).
at::Tensor aten_encode(at::Tensor& rows, const WireLayout& w) {
  const int64_t r = rows.size(0);
  auto padded = at::zeros({r, w.padded()}, rows.options());
  padded.narrow(1, 0, w.slice).copy_(rows);
  const auto blocks = padded.view({r * w.blocks, w.block});
  const auto finite = at::isfinite(blocks).all(1, /*keepdim=*/true);
  const auto max_abs = at::where(finite, blocks.abs().amax(1, /*keepdim=*/true),
                                 at::full({1, 1}, std::numeric_limits<float>::quiet_NaN(), blocks.options()));
  const auto scales = at::where(max_abs > 0, max_abs / 127.0, at::ones_like(max_abs)).where(finite, max_abs);
  const auto values = at::where(finite, at::clamp(at::round(blocks / scales), -127, 127), at::zeros_like(blocks));
  auto bytes = at::empty({r, w.row_bytes()}, rows.options().dtype(at::kByte));
  bytes.narrow(1, 0, w.padded()).copy_(values.to(at::kChar).view(at::kByte).view({r, w.padded()}));
  bytes.narrow(1, w.padded(), w.blocks * 4).copy_(scales.contiguous().view({r, w.blocks}).view(at::kByte));
  rows.copy_((values * scales).view({r, w.padded()}).narrow(1, 0, w.slice));
  return bytes;
}

// x - dequantized, zero where that is not finite (device path).
at::Tensor finite_residual(const at::Tensor& original, const at::Tensor& dequantized) {
  const auto d = original - dequantized;
  return at::where(at::isfinite(d), d, at::zeros_like(d));
}

// Device tensors: wire rows [r, row_bytes()] to [r, slice] float32, or with
// `sum` to their sum [1, slice].
at::Tensor aten_decode(const at::Tensor& bytes, const WireLayout& w, bool sum) {
  const int64_t r = bytes.size(0);
  const auto values = bytes.narrow(1, 0, w.padded()).contiguous().view(at::kChar).view({r, w.blocks, w.block});
  const auto scales = bytes.narrow(1, w.padded(), w.blocks * 4).contiguous().view(at::kFloat).view({r, w.blocks, 1});
  const auto rows = (values.to(at::kFloat) * scales).view({r, w.padded()}).narrow(1, 0, w.slice);
  return sum ? rows.sum(0, /*keepdim=*/true) : rows;
}

// A tensor of `numel` elements of `dtype` like `like`: `keep` when it fits.
at::Tensor reuse(const at::Tensor& keep, int64_t numel, at::ScalarType dtype, const at::Tensor& like) {
  if (keep.defined() && keep.numel() == numel && keep.scalar_type() == dtype && keep.device() == like.device())
    return keep;
  return at::empty({numel}, like.options().dtype(dtype));
}

// Both phases (or the first alone, `scatter_to` defined) as one Work
// (comm/two_phase_work.h).
class Int8AllReduce final : public comm::TwoPhaseWork {
 public:
  Int8AllReduce(comm::ProcessGroup& group, const at::Tensor& buffer, Int8Residuals residuals,
                comm::ProcessGroup& gather_group, const WireLayout& layout, at::Tensor scatter_to,
                std::shared_ptr<Int8Scratch> scratch)
      : group_(group), gather_group_(gather_group), buffer_(buffer), residuals_(std::move(residuals)),
        layout_(layout), scatter_to_(std::move(scatter_to)),
        scratch_(scratch ? std::move(scratch) : std::make_shared<Int8Scratch>()) {
    const WireLayout& w = layout_;
    at::NoGradGuard no_grad;
    Int8Scratch& k = *scratch_;
    k.send = reuse(k.send, w.p * w.row_bytes(), at::kByte, buffer).view({w.p, w.row_bytes()});
    k.recv = reuse(k.recv, w.p * w.row_bytes(), at::kByte, buffer).view({w.p, w.row_bytes()});
    k.x = reuse(k.x, w.p * w.slice, at::kFloat, buffer);
    if (buffer.is_cpu()) {
      // x = buffer + residual, zero past the buffer; then one encode pass
      // that also leaves the new residual.
      float* x = k.x.data_ptr<float>();
      float* sent = residuals_.sent.defined() ? residuals_.sent.data_ptr<float>() : nullptr;
      if (buffer.scalar_type() == at::kFloat && sent) {
        const float* b = buffer.data_ptr<float>();
        for (int64_t i = 0; i < w.numel; ++i) x[i] = b[i] + sent[i];
      } else {
        k.x.narrow(0, 0, w.numel).copy_(buffer.reshape({-1}));
        if (sent) k.x.narrow(0, 0, w.numel).add_(residuals_.sent);
      }
      std::fill(x + w.numel, x + w.p * w.slice, 0.0f);
      cpu_encode(x, w.p, w, k.send.data_ptr<uint8_t>(), sent, w.numel);
    } else {
      auto flat = k.x.narrow(0, 0, w.numel);
      k.x.zero_();
      flat.copy_(buffer.reshape({-1}));
      if (residuals_.sent.defined()) flat.add_(residuals_.sent);
      const auto original = residuals_.sent.defined() ? flat.clone() : at::Tensor();
      auto rows = k.x.view({w.p, w.slice});
      k.send.copy_(aten_encode(rows, w));
      if (residuals_.sent.defined()) residuals_.sent.copy_(finite_residual(original, flat));
    }
    begin(group.all_to_all(k.recv, k.send));
  }

 private:
  comm::WorkHandle after_first() override {
    at::NoGradGuard no_grad;
    const WireLayout& w = layout_;
    Int8Scratch& k = *scratch_;
    // Row s of recv: rank s's copy of this rank's slice. Added in fp32, in
    // rank order (the same order on every owner).
    at::Tensor mine;
    if (k.recv.is_cpu()) {
      k.mine = reuse(k.mine, w.slice, at::kFloat, k.recv);
      cpu_decode(k.recv.data_ptr<uint8_t>(), w.p, w, k.mine.data_ptr<float>(), /*sum=*/true, 0);
      mine = k.mine.view({1, w.slice});
    } else {
      mine = aten_decode(k.recv, w, /*sum=*/true);
    }
    if (scatter_to_.defined()) {
      scatter_to_.view({-1}).copy_(mine.view({-1}));
      return nullptr;
    }
    if (residuals_.summed.defined()) mine.add_(residuals_.summed.view({1, w.slice}));
    k.slice = reuse(k.slice, w.row_bytes(), at::kByte, k.recv);
    k.gathered = reuse(k.gathered, w.p * w.row_bytes(), at::kByte, k.recv);
    if (k.recv.is_cpu()) {
      float* summed = residuals_.summed.defined() ? residuals_.summed.data_ptr<float>() : nullptr;
      cpu_encode(mine.data_ptr<float>(), 1, w, k.slice.data_ptr<uint8_t>(), summed, w.slice);
    } else {
      const auto original = residuals_.summed.defined() ? mine.clone() : at::Tensor();
      k.slice.copy_(aten_encode(mine, w).view({-1}));
      if (residuals_.summed.defined()) residuals_.summed.view({1, w.slice}).copy_(finite_residual(original, mine));
    }
    return gather_group_.all_gather(k.gathered, k.slice);
  }

  void after_second() override {
    at::NoGradGuard no_grad;
    const WireLayout& w = layout_;
    Int8Scratch& k = *scratch_;
    if (k.gathered.is_cpu() && buffer_.scalar_type() == at::kFloat) {
      cpu_decode(k.gathered.data_ptr<uint8_t>(), w.p, w, buffer_.data_ptr<float>(), false, w.numel);
    } else if (k.gathered.is_cpu()) {
      cpu_decode(k.gathered.data_ptr<uint8_t>(), w.p, w, k.x.data_ptr<float>(), false, w.numel);
      buffer_.view({-1}).copy_(k.x.narrow(0, 0, w.numel));
    } else {
      const auto sum = aten_decode(k.gathered.view({w.p, w.row_bytes()}), w, false).reshape({-1});
      buffer_.view({-1}).copy_(sum.narrow(0, 0, w.numel));
    }
  }

  comm::ProcessGroup& group_;
  comm::ProcessGroup& gather_group_;
  at::Tensor buffer_;
  Int8Residuals residuals_;
  WireLayout layout_;
  at::Tensor scatter_to_;
  std::shared_ptr<Int8Scratch> scratch_;
};

void check_residual(const at::Tensor& t, int64_t numel, const at::Tensor& like, const char* what) {
  if (!t.defined()) return;
  if (t.scalar_type() != at::kFloat || !t.is_contiguous() || t.numel() != numel || t.device() != like.device())
    throw Error(fmt::format("int8 wire: the {} residual must be a contiguous float32 tensor of {} elements on {} "
                            "(got {}, {} elements, {})",
                            what, numel, like.device().str(), c10::toString(t.scalar_type()), t.numel(),
                            t.device().str()));
}

void check_block(int64_t block) {
  if (block < 1) throw Error(fmt::format("int8 wire: the block must hold at least one element (got {})", block));
}

}  // namespace

int64_t int8_slice_numel(int64_t numel, int p) { return (numel + p - 1) / p; }

int64_t int8_wire_bytes_per_phase(int64_t numel, int p, int64_t block) {
  const WireLayout w(p, numel, int8_slice_numel(numel, p), block);
  return (p - 1) * w.row_bytes();
}

comm::WorkHandle all_reduce_int8(comm::ProcessGroup& group, at::Tensor& buffer, Int8Residuals residuals,
                                 comm::ProcessGroup& gather_group, int64_t block,
                                 std::shared_ptr<Int8Scratch> scratch) {
  check_block(block);
  if (!buffer.is_contiguous() || !at::isFloatingType(buffer.scalar_type()))
    throw Error(fmt::format("all_reduce_int8: the buffer must be a contiguous floating-point tensor (got {}, {})",
                            c10::toString(buffer.scalar_type()), buffer.is_contiguous() ? "contiguous" : "strided"));
  if (gather_group.size() != group.size())
    throw Error(fmt::format("all_reduce_int8: the gather group has {} ranks, the group {}", gather_group.size(),
                            group.size()));
  const int p = group.size();
  const WireLayout layout(p, buffer.numel(), int8_slice_numel(buffer.numel(), p), block);
  check_residual(residuals.sent, buffer.numel(), buffer, "sent");
  check_residual(residuals.summed, layout.slice, buffer, "summed");
  return std::make_shared<Int8AllReduce>(group, buffer, std::move(residuals), gather_group, layout, at::Tensor(),
                                         std::move(scratch));
}

comm::WorkHandle reduce_scatter_int8(comm::ProcessGroup& group, at::Tensor& output, const at::Tensor& input,
                                     at::Tensor sent, int64_t block, std::shared_ptr<Int8Scratch> scratch) {
  check_block(block);
  if (!input.is_contiguous() || !at::isFloatingType(input.scalar_type()) || !output.is_contiguous() ||
      input.numel() != output.numel() * group.size())
    throw Error(fmt::format("reduce_scatter_int8: input ({} elements, {}) must be contiguous floating point with "
                            "size ({}) x output ({}) elements, output contiguous",
                            input.numel(), c10::toString(input.scalar_type()), group.size(), output.numel()));
  const WireLayout layout(group.size(), input.numel(), output.numel(), block);
  check_residual(sent, input.numel(), input, "sent");
  return std::make_shared<Int8AllReduce>(group, input, Int8Residuals{std::move(sent), {}}, group, layout, output,
                                         std::move(scratch));
}

}  // namespace paratrain::ddp

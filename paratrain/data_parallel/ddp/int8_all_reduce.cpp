// The int8 gradient wire: see int8_all_reduce.h and Note [The int8 gradient
// wire] there.
#include "paratrain/data_parallel/ddp/int8_all_reduce.h"

#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/quant/quantize.h"

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

// `rows` ([r, slice] float) quantized per block: r rows of row_bytes(), the
// int8 values then the scales. `rows` becomes what the bytes stand for
// (dequantized), so the caller's residual is original - rows.
at::Tensor encode(at::Tensor& rows, const WireLayout& w) {
  const int64_t r = rows.size(0);
  auto padded = at::zeros({r, w.padded()}, rows.options());
  padded.narrow(1, 0, w.slice).copy_(rows);
  const auto q = quant::quantize_symmetric(padded.view({r * w.blocks, w.block}), 8,
                                           quant::Granularity::kPerChannel);
  auto bytes = at::empty({r, w.row_bytes()}, rows.options().dtype(at::kByte));
  bytes.narrow(1, 0, w.padded()).copy_(q.values.view(at::kByte).view({r, w.padded()}));
  bytes.narrow(1, w.padded(), w.blocks * 4).copy_(q.scales.view({r, w.blocks}).view(at::kByte));
  rows.copy_(quant::dequantize(q).view({r, w.padded()}).narrow(1, 0, w.slice));
  return bytes;
}

// [r, row_bytes()] back to [r, slice] float32.
at::Tensor decode(const at::Tensor& bytes, const WireLayout& w) {
  const int64_t r = bytes.size(0);
  const auto values = bytes.narrow(1, 0, w.padded()).contiguous().view(at::kChar).view({r, w.blocks, w.block});
  const auto scales = bytes.narrow(1, w.padded(), w.blocks * 4).contiguous().view(at::kFloat).view({r, w.blocks, 1});
  return (values.to(at::kFloat) * scales).view({r, w.padded()}).narrow(1, 0, w.slice);
}

// Both phases (or the first alone, `scatter_to` defined) as one Work; the
// state machine advances under a lock from whichever thread polls or waits,
// as comm/low_precision_all_reduce.cpp's does.
class Int8AllReduce final : public comm::Work {
 public:
  Int8AllReduce(comm::ProcessGroup& group, const at::Tensor& buffer, Int8Residuals residuals,
                comm::ProcessGroup& gather_group, const WireLayout& layout, at::Tensor scatter_to)
      : group_(group), gather_group_(gather_group), buffer_(buffer), residuals_(std::move(residuals)),
        layout_(layout), scatter_to_(std::move(scatter_to)) {
    const WireLayout& w = layout_;
    at::NoGradGuard no_grad;
    auto x = at::zeros({w.p * w.slice}, buffer.options().dtype(at::kFloat));
    auto flat = x.narrow(0, 0, w.numel);
    flat.copy_(buffer.reshape({-1}));
    if (residuals_.sent.defined()) flat.add_(residuals_.sent);
    auto rows = x.view({w.p, w.slice});
    const auto original = residuals_.sent.defined() ? flat.clone() : at::Tensor();
    send_ = encode(rows, w);
    if (residuals_.sent.defined()) residuals_.sent.copy_(original - flat);
    recv_ = at::empty_like(send_);
    stage_ = group.all_to_all(recv_, send_);
  }

  void wait(std::chrono::milliseconds timeout) override {
    std::lock_guard lock(mutex_);
    if (phase_ == Phase::kScatter) {
      stage_->wait(timeout);
      start_gather();
    }
    if (phase_ == Phase::kGather) {
      stage_->wait(timeout);
      finish();
    }
  }

  bool is_completed() override {
    std::lock_guard lock(mutex_);
    if (phase_ == Phase::kScatter && stage_->is_completed()) {
      stage_->wait(std::chrono::milliseconds(0));
      start_gather();
    }
    if (phase_ == Phase::kGather && stage_->is_completed()) {
      stage_->wait(std::chrono::milliseconds(0));
      finish();
    }
    return phase_ == Phase::kDone;
  }

  std::optional<Clock::time_point> completed_at() override {
    std::lock_guard lock(mutex_);
    return done_at_;
  }

 private:
  enum class Phase { kScatter, kGather, kDone };

  void start_gather() {
    at::NoGradGuard no_grad;
    const WireLayout& w = layout_;
    // Row s: rank s's copy of this rank's slice. Added in fp32, in rank order
    // (the same order on every owner).
    auto mine = decode(recv_, w).sum(0, /*keepdim=*/true);
    send_ = recv_ = at::Tensor();
    if (scatter_to_.defined()) {
      scatter_to_.view({-1}).copy_(mine.view({-1}));
      done();
      return;
    }
    if (residuals_.summed.defined()) mine.add_(residuals_.summed.view({1, w.slice}));
    const auto original = residuals_.summed.defined() ? mine.clone() : at::Tensor();
    slice_ = encode(mine, w).view({-1});
    if (residuals_.summed.defined()) residuals_.summed.view({1, w.slice}).copy_(original - mine);
    gathered_ = at::empty({w.p * w.row_bytes()}, slice_.options());
    stage_ = gather_group_.all_gather(gathered_, slice_);
    phase_ = Phase::kGather;
  }

  void finish() {
    at::NoGradGuard no_grad;
    const WireLayout& w = layout_;
    const auto sum = decode(gathered_.view({w.p, w.row_bytes()}), w).reshape({-1}).narrow(0, 0, w.numel);
    buffer_.view({-1}).copy_(sum);
    slice_ = gathered_ = at::Tensor();
    done();
  }

  void done() {
    phase_ = Phase::kDone;
    done_at_ = Clock::now();
    stage_.reset();
  }

  comm::ProcessGroup& group_;
  comm::ProcessGroup& gather_group_;
  at::Tensor buffer_;
  Int8Residuals residuals_;
  WireLayout layout_;
  at::Tensor scatter_to_;
  at::Tensor send_, recv_, slice_, gathered_;
  comm::WorkHandle stage_;
  Phase phase_ = Phase::kScatter;
  std::optional<Clock::time_point> done_at_;
  std::mutex mutex_;
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
                                 comm::ProcessGroup& gather_group, int64_t block) {
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
  return std::make_shared<Int8AllReduce>(group, buffer, std::move(residuals), gather_group, layout, at::Tensor());
}

comm::WorkHandle reduce_scatter_int8(comm::ProcessGroup& group, at::Tensor& output, const at::Tensor& input,
                                     at::Tensor sent, int64_t block) {
  check_block(block);
  if (!input.is_contiguous() || !at::isFloatingType(input.scalar_type()) || !output.is_contiguous() ||
      input.numel() != output.numel() * group.size())
    throw Error(fmt::format("reduce_scatter_int8: input ({} elements, {}) must be contiguous floating point with "
                            "size ({}) x output ({}) elements, output contiguous",
                            input.numel(), c10::toString(input.scalar_type()), group.size(), output.numel()));
  const WireLayout layout(group.size(), input.numel(), output.numel(), block);
  check_residual(sent, input.numel(), input, "sent");
  return std::make_shared<Int8AllReduce>(group, input, Int8Residuals{std::move(sent), {}}, group, layout, output);
}

}  // namespace paratrain::ddp

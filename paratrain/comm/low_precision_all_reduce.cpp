#include "paratrain/comm/low_precision_all_reduce.h"

#include <fmt/format.h>

#include "paratrain/comm/two_phase_work.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

// Two collectives and the fp32 sum between them, as one Work
// (two_phase_work.h). With `scatter_to` defined (reduce_scatter_low_precision),
// the fp32 sum of this rank's slice lands there and the work ends after the
// first phase.
class LowPrecisionAllReduce final : public TwoPhaseWork {
 public:
  LowPrecisionAllReduce(ProcessGroup& group, const at::Tensor& buffer, at::ScalarType wire,
                        ProcessGroup& gather_group, at::Tensor scatter_to = {})
      : group_(group), gather_group_(gather_group), buffer_(buffer), wire_(wire), scatter_to_(std::move(scatter_to)) {
    const int64_t p = group.size();
    const int64_t n = buffer.numel();
    chunk_ = (n + p - 1) / p;
    // The padded 16-bit copy, cut into p slices of `chunk_`; slice j goes to
    // rank j. Sent as bytes: the backend needs no 16-bit kernels.
    auto send = at::zeros({p * chunk_}, buffer.options().dtype(wire));
    send.narrow(0, 0, n).copy_(buffer.reshape({-1}));
    send_bytes_ = send.view(at::kByte).reshape({p, chunk_ * 2});
    recv_bytes_ = at::empty_like(send_bytes_);
    begin(group.all_to_all(recv_bytes_, send_bytes_));
  }

 private:
  WorkHandle after_first() override {
    // Row s holds rank s's copy of this rank's slice: add in fp32.
    const auto mine = recv_bytes_.view(wire_).reshape({group_.size(), chunk_}).to(at::kFloat).sum(0);
    if (scatter_to_.defined()) {
      scatter_to_.view({-1}).copy_(mine);
      return nullptr;
    }
    slice_bytes_ = mine.to(wire_).view(at::kByte);
    gathered_bytes_ = at::empty({group_.size() * chunk_ * 2}, slice_bytes_.options());
    return gather_group_.all_gather(gathered_bytes_, slice_bytes_);
  }

  void after_second() override {
    const auto sum = gathered_bytes_.view(wire_).narrow(0, 0, buffer_.numel());
    buffer_.view({-1}).copy_(sum);
  }

  ProcessGroup& group_;
  ProcessGroup& gather_group_;
  at::Tensor buffer_;
  at::ScalarType wire_;
  at::Tensor scatter_to_;
  int64_t chunk_ = 0;
  at::Tensor send_bytes_, recv_bytes_, slice_bytes_, gathered_bytes_;
};

}  // namespace

WorkHandle all_reduce_low_precision(ProcessGroup& group, at::Tensor& buffer, at::ScalarType wire,
                                    ProcessGroup* gather_group) {
  if (wire != at::kBFloat16 && wire != at::kHalf) {
    throw Error(fmt::format("all_reduce_low_precision: the wire dtype must be bf16 or fp16, not {}",
                            c10::toString(wire)));
  }
  if (!buffer.is_contiguous() || !at::isFloatingType(buffer.scalar_type())) {
    throw Error(fmt::format("all_reduce_low_precision: the buffer must be a contiguous floating-point tensor "
                            "(got {}, {})",
                            c10::toString(buffer.scalar_type()), buffer.is_contiguous() ? "contiguous" : "strided"));
  }
  if (gather_group && gather_group->size() != group.size())
    throw Error(fmt::format("all_reduce_low_precision: the gather group has {} ranks, the group {}",
                            gather_group->size(), group.size()));
  return std::make_shared<LowPrecisionAllReduce>(group, buffer, wire, gather_group ? *gather_group : group);
}

WorkHandle reduce_scatter_low_precision(ProcessGroup& group, at::Tensor& output, const at::Tensor& input,
                                        at::ScalarType wire) {
  if (wire != at::kBFloat16 && wire != at::kHalf) {
    throw Error(fmt::format("reduce_scatter_low_precision: the wire dtype must be bf16 or fp16, not {}",
                            c10::toString(wire)));
  }
  if (!input.is_contiguous() || !at::isFloatingType(input.scalar_type()) || !output.is_contiguous() ||
      input.numel() != output.numel() * group.size()) {
    throw Error(fmt::format("reduce_scatter_low_precision: input ({} elements, {}) must be contiguous floating "
                            "point with size ({}) x output ({}) elements, output contiguous",
                            input.numel(), c10::toString(input.scalar_type()), group.size(), output.numel()));
  }
  return std::make_shared<LowPrecisionAllReduce>(group, input, wire, group, output);
}

}  // namespace paratrain::comm

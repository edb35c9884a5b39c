// UnitGradSink: reduce-scatter of a unit's gradient into this rank's shard.
// See grad_sink.h.
#include "paratrain/data_parallel/fsdp/grad_sink.h"

#include <torch/torch.h>

namespace paratrain::fsdp {

UnitGradSink::UnitGradSink(const std::vector<FlatUnit>& units,
                           const std::vector<std::vector<at::Tensor>>& pieces,
                           std::vector<std::size_t> bucket_to_unit)
    : units_(units), pieces_(pieces), bucket_to_unit_(std::move(bucket_to_unit)), send_(units.size()),
      out_(units.size()) {
  if (bucket_to_unit_.empty()) {
    for (std::size_t u = 0; u < units.size(); ++u) bucket_to_unit_.push_back(u);
  }
  TORCH_CHECK(bucket_to_unit_.size() == units.size(), "UnitGradSink: ", bucket_to_unit_.size(),
              " buckets for ", units.size(), " units");
}

comm::WorkHandle UnitGradSink::launch(comm::ProcessGroup& group, std::size_t bucket, at::Tensor& buffer) {
  TORCH_CHECK(bucket < units_.size(), "UnitGradSink: bucket ", bucket, " of ", units_.size());
  const std::size_t index = bucket_to_unit_[bucket];
  const FlatUnit& unit = units_[index];
  TORCH_CHECK(buffer.numel() == unit.padded_numel() || buffer.numel() == unit.numel(), "UnitGradSink: unit '",
              unit.name(), "' gradient has ", buffer.numel(), " elements, expected ", unit.numel(), " or ",
              unit.padded_numel());
  if (buffer.numel() == unit.padded_numel()) {
    send_[index] = buffer;
  } else {
    send_[index] = at::zeros({unit.padded_numel()}, buffer.options());
    send_[index].narrow(0, 0, unit.numel()).copy_(buffer.reshape({-1}));
  }
  out_[index] = at::empty({unit.shard_numel()}, buffer.options());
  ++launches_;
  // Note [Averaging] in the reducer: the buffer is pre-divided, so a sum here
  // is the average, and the same code serves any group size.
  return group.reduce_scatter(out_[index], send_[index], comm::ReduceOp::kSum);
}

void UnitGradSink::reduced(std::size_t bucket, at::Tensor& /*buffer*/) {
  const std::size_t index = bucket_to_unit_.at(bucket);
  const FlatUnit& unit = units_[index];
  at::NoGradGuard no_grad;
  for (std::size_t k = 0; k < unit.pieces().size(); ++k) {
    const ShardPiece& piece = unit.pieces()[k];
    at::Tensor slice = out_[index].narrow(0, piece.shard_begin, piece.numel);
    at::Tensor param = pieces_[index][k];
    if (param.grad().defined()) {
      param.mutable_grad().add_(slice);
    } else {
      param.mutable_grad() = slice.clone();
    }
  }
  send_[index] = at::Tensor();
  out_[index] = at::Tensor();
}

}  // namespace paratrain::fsdp

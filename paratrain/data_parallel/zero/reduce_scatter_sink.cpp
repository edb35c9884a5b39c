// ReduceScatterSink: see reduce_scatter_sink.h.
#include "paratrain/data_parallel/zero/reduce_scatter_sink.h"

#include <c10/util/Exception.h>

#include "paratrain/comm/low_precision_all_reduce.h"

namespace paratrain::zero {

ReduceScatterSink::ReduceScatterSink(std::vector<at::Tensor> shards, at::ScalarType wire,
                                     std::shared_ptr<ddp::Int8Compression> int8)
    : shards_(std::move(shards)), wire_(wire), int8_(std::move(int8)) {
  TORCH_CHECK(wire == at::kFloat || wire == at::kBFloat16 || wire == at::kHalf,
              "ReduceScatterSink: the wire is fp32, bf16 or fp16, not ", wire);
  TORCH_CHECK(!int8_ || wire == at::kFloat, "ReduceScatterSink: the int8 wire and a 16-bit wire are exclusive");
}

comm::WorkHandle ReduceScatterSink::launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) {
  TORCH_CHECK(index < shards_.size(), "ReduceScatterSink: bucket ", index, " but only ", shards_.size(),
              " shards were given");
  at::Tensor& shard = shards_[index];
  TORCH_CHECK(buffer.numel() == shard.numel() * group.size(), "ReduceScatterSink: bucket ", index, " has ",
              buffer.numel(), " elements, expected shard (", shard.numel(), ") * group size (", group.size(),
              "); plan buckets with pad_to_multiple = group size");
  if (int8_) return int8_->reduce_scatter(group, index, shard, buffer);
  // 16-bit wires only make sense for float32 buckets (a bf16 bucket is
  // already as small, and goes as it is).
  if (wire_ != at::kFloat && buffer.scalar_type() == at::kFloat)
    return comm::reduce_scatter_low_precision(group, shard, buffer, wire_);
  return group.reduce_scatter(shard, buffer, comm::ReduceOp::kSum);
}

}  // namespace paratrain::zero

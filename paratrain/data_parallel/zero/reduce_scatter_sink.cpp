// ReduceScatterSink: see reduce_scatter_sink.h.
#include "paratrain/data_parallel/zero/reduce_scatter_sink.h"

#include <c10/util/Exception.h>

namespace paratrain::zero {

ReduceScatterSink::ReduceScatterSink(std::vector<at::Tensor> shards) : shards_(std::move(shards)) {}

comm::WorkHandle ReduceScatterSink::launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) {
  TORCH_CHECK(index < shards_.size(), "ReduceScatterSink: bucket ", index, " but only ", shards_.size(),
              " shards were given");
  at::Tensor& shard = shards_[index];
  TORCH_CHECK(buffer.numel() == shard.numel() * group.size(), "ReduceScatterSink: bucket ", index, " has ",
              buffer.numel(), " elements, expected shard (", shard.numel(), ") * group size (", group.size(),
              "); plan buckets with pad_to_multiple = group size");
  return group.reduce_scatter(shard, buffer, comm::ReduceOp::kSum);
}

}  // namespace paratrain::zero

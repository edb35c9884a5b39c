// ReduceScatterSink: the ZeRO-2 end of a gradient bucket. The reducer fills a
// bucket (padded to a multiple of the group size) during backward; this sink
// reduce-scatters it so each rank receives only the average of its own slice,
// straight into that rank's gradient shard. Not here: the bucketing and the
// overlap with backward (ddp/reducer.h), which slice is whose (shard_layout.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <vector>

#include "paratrain/data_parallel/ddp/bucket_sink.h"
#include "paratrain/data_parallel/ddp/int8_compression.h"

namespace paratrain::zero {

class ReduceScatterSink final : public ddp::BucketSink {
 public:
  // shards[b]: where bucket b's reduced slice lands, contiguous, with
  // padded_numel(b) / group size elements. The tensors are written in place
  // (views of a caller's flat buffer work), when the returned work completes.
  // `wire`: kFloat sends the buckets as they are; kBFloat16 / kHalf sends
  // them as 16 bits and sums in fp32 (comm::reduce_scatter_low_precision):
  // half the bytes, each average rounded once to 16 bits per rank.
  // `int8` (ddp.compression = "int8"): the int8 wire with error feedback
  // instead (ddp/int8_all_reduce.h), attached to this sink's reducer for
  // reduce-scatter; `wire` must then be kFloat.
  explicit ReduceScatterSink(std::vector<at::Tensor> shards, at::ScalarType wire = at::kFloat,
                             std::shared_ptr<ddp::Int8Compression> int8 = nullptr);

  // Reduce-scatter (sum) of `buffer`, already divided by the group size, so
  // shard `index` receives the average over ranks of this rank's slice.
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override;
  // The result lives in the shard; full-size gradients are not kept.
  bool writes_back() const override { return false; }

 private:
  std::vector<at::Tensor> shards_;
  at::ScalarType wire_;
  std::shared_ptr<ddp::Int8Compression> int8_;
};

}  // namespace paratrain::zero

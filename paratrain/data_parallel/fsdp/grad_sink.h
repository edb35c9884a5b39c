// UnitGradSink: what happens to one FSDP unit's flat gradient once backward
// produced all of it: reduce-scatter it so this rank keeps only the averaged
// slice it owns, and add that slice into the .grad of the optimizer's shard
// pieces. A ddp::BucketSink: the DDP reducer drives it, one bucket per unit.
// Not here: deciding when a unit's gradient is complete (the reducer).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "paratrain/data_parallel/ddp/bucket_sink.h"
#include "paratrain/data_parallel/fsdp/flat_unit.h"

namespace paratrain::fsdp {

class UnitGradSink final : public ddp::BucketSink {
 public:
  // `units` and `pieces` (pieces[u][k]: the optimizer's leaf tensor for
  // units[u].pieces()[k]) must outlive the sink. `bucket_to_unit[b]`: the
  // unit that bucket index b stands for (empty: b itself), for a reducer
  // whose buckets run in another order than the units.
  UnitGradSink(const std::vector<FlatUnit>& units, const std::vector<std::vector<at::Tensor>>& pieces,
               std::vector<std::size_t> bucket_to_unit = {});

  // `buffer`: unit `index`'s gradients in flat-buffer order, already divided
  // by the group size, either padded_numel() long or numel() long (then
  // padded here with zeros).
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override;
  // Adds the reduced slice into each piece's .grad (creating it when
  // undefined, e.g. after zero_grad(set_to_none)); accumulating keeps
  // several synchronized backwards before one step correct.
  void reduced(std::size_t index, at::Tensor& buffer) override;
  bool writes_back() const override { return false; }
  // Reduce-scatters launched so far.
  int64_t launches() const { return launches_; }

 private:
  const std::vector<FlatUnit>& units_;
  const std::vector<std::vector<at::Tensor>>& pieces_;
  std::vector<std::size_t> bucket_to_unit_;
  int64_t launches_ = 0;
  std::vector<at::Tensor> send_;  // per unit: the padded input, alive while in flight
  std::vector<at::Tensor> out_;   // per unit: this rank's reduced slice
};

}  // namespace paratrain::fsdp

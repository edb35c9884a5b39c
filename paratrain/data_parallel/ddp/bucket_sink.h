// BucketSink: what happens to a gradient bucket once the reducer filled it.
// The reducer (reducer.h) owns "which gradients are ready, launch buckets in
// index order, overlap with backward, wait at the end"; a sink owns the
// collective and the result. DDP's default sink all-reduces and lets the
// reducer write the average back into every .grad; ZeRO-2 and FSDP
// reduce-scatter and keep only this rank's shard.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

#include "paratrain/comm/process_group.h"

namespace paratrain::ddp {

class BucketSink {
 public:
  virtual ~BucketSink() = default;

  // Starts bucket `index`'s collective and returns it in flight. Called on
  // the backward thread (or, for buckets completed at the end of backward,
  // in autograd's end-of-backward callback), once per synchronized step per
  // bucket, in index order. Every rank calls it for the same buckets in the
  // same order, so a collective issued here pairs up across ranks. `buffer` holds this rank's gradients already divided by the group
  // size (Note [Averaging]), padding zero; it must stay untouched until the
  // returned work completes.
  virtual comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) = 0;

  // At the end of backward, after bucket `index`'s work completed, in index
  // order: consume the result.
  virtual void reduced(std::size_t index, at::Tensor& buffer) {}

  // True: `buffer` now holds the average over ranks and the reducer writes it
  // back into each parameter's .grad (DDP). False: the sink consumed the
  // result in reduced(), and the reducer resets the .grad of every
  // synchronized parameter to undefined so full-size gradients do not outlive
  // the step (ZeRO-2, FSDP).
  virtual bool writes_back() const { return true; }
};

}  // namespace paratrain::ddp

// TensorSlot: "this rank holds elements [flat_offset, flat_offset + numel) of
// the global tensor `name`". The vocabulary between strategies (which know
// what each rank holds: a full replica, a ZeRO shard piece, a TP slice) and
// sharded checkpoints (which store and re-cut global tensors). Not a tensor
// type and no I/O: see checkpoint/sharded.h for how slots are saved.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain {

// A run of a slot's elements: local flat [local_offset, local_offset + numel)
// holds global flat [global_offset, global_offset + numel).
struct SlotSegment {
  int64_t local_offset = 0;
  int64_t global_offset = 0;
  int64_t numel = 0;
  bool operator==(const SlotSegment&) const = default;
};

struct TensorSlot {
  // Global name without prefix: "fc0.weight" (the checkpoint adds "model/"
  // or "optimizer/<name>/<field>").
  std::string name;
  // Shape of the whole (unsharded) tensor, the same on every rank.
  std::vector<int64_t> global_shape;
  // Where `local` starts in the row-major flattening of the global tensor.
  int64_t flat_offset = 0;
  // This rank's elements, numel() of them, contiguous when flattened. Loading
  // writes into it in place (copy_), so aliases (optimizer params, views into
  // flat buffers) see the loaded values.
  at::Tensor local;
  // False when this rank holds a replica that another rank writes (DDP:
  // every rank holds every parameter, rank 0 writes them). Loading fills
  // every slot, written or not.
  bool write = true;
  // Empty: `local` is one run of the global tensor starting at flat_offset.
  // Otherwise `local`'s elements are these runs, in local order, covering
  // local exactly (flat_offset is unused): a tensor-parallel shard that is not
  // contiguous in the global tensor, e.g. a row-parallel weight's columns
  // (one run per row) or the q, k and v rows of some heads.
  std::vector<SlotSegment> segments = {};
};

// The runs of `slot`: its segments, or the one run at flat_offset.
inline std::vector<SlotSegment> slot_segments(const TensorSlot& slot) {
  if (!slot.segments.empty()) return slot.segments;
  return {SlotSegment{0, slot.flat_offset, slot.local.defined() ? slot.local.numel() : 0}};
}

}  // namespace paratrain

// TensorSlot: "this rank holds elements [flat_offset, flat_offset + numel) of
// the global tensor `name`". The vocabulary between strategies (which know
// what each rank holds: a full replica, a ZeRO shard piece, a TP slice) and
// sharded checkpoints (which store and re-cut global tensors). Not a tensor
// type and no I/O: see train/checkpoint/sharded.h for how slots are saved.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain {

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
};

}  // namespace paratrain

// How a tensor-parallel parameter relates to the single-process parameter it
// is a shard of, and the two conversions built on that: load a tensor-parallel
// module from the full (single-process) parameters, and gather the shards back
// into full tensors (consolidated checkpoints, tests).
// Not here: the layers themselves (layers.h), writing checkpoint files (train/).
//
// The layout (Megatron calls `groups` the partition "stride"): along `dim`,
// the full tensor is `groups` equal parts, each cut into tp equal chunks; rank
// r holds chunk r of every part, concatenated in part order. groups = 1 is a
// contiguous slice (ColumnParallelLinear rows, RowParallelLinear columns, the
// vocabulary rows of VocabParallelEmbedding); groups = 3 is the fused q/k/v
// projection, where rank r holds the rows of its heads in each of q, k and v.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/core/tensor_slot.h"
#include "paratrain/tensor_parallel/context.h"

namespace paratrain::tensor_parallel {

struct ShardSpec {
  // The dimension the full tensor is split along; -1: replicated (every rank
  // holds the whole tensor).
  int64_t dim = -1;
  // Equal parts along `dim` that are each split over the ranks (see above).
  int64_t groups = 1;
  // The full (single-process) tensor's shape.
  std::vector<int64_t> full_shape;

  bool replicated() const { return dim < 0; }
};

// One contiguous run along `dim` that a rank holds: local rows
// [local_offset, local_offset + length) are full rows [full_offset, ...).
// A checkpoint writer maps a shard to (full name, dim, offset) with these.
struct ShardPiece {
  int64_t local_offset = 0;
  int64_t full_offset = 0;
  int64_t length = 0;
};
std::vector<ShardPiece> pieces(const ShardSpec& spec, int rank, int tp);

/// The runs of the global tensor's row-major flattening that `rank`'s shard
/// holds, in local order (a checkpoint slot's segments: for each index of
/// the dimensions before the split one, the shard's pieces along it).
std::vector<SlotSegment> slot_segments(const ShardSpec& spec, int rank, int tp);

// This rank's shard of `full` (a copy, contiguous).
at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int tp);
// The full tensor from every rank's shard, stacked in rank order along a new
// leading dimension (what an all-gather returns).
at::Tensor unshard(const at::Tensor& stacked_shards, const ShardSpec& spec);

// A module whose own (direct) parameters are shards says how, by local name
// ("weight", "bias"). Parameters it does not list are replicated.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  virtual std::vector<std::pair<std::string, ShardSpec>> shard_specs() const = 0;
};

// The layout of every parameter of `root` under its full dotted name
// (e.g. "blocks.0.attn.qkv.weight"), replicated ones included.
torch::OrderedDict<std::string, ShardSpec> parameter_layout(const torch::nn::Module& root);

// Copies this rank's shard of each full tensor into the parameter of the same
// name; replicated parameters take the full tensor. Every parameter of `root`
// must be found in `full` with the full shape its layout states (Error
// otherwise, naming the parameter). Local: no communication.
void load_full_parameters(torch::nn::Module& root, const torch::OrderedDict<std::string, at::Tensor>& full,
                          const TpContext& ctx);

enum class Gather { kValues, kGradients };
// The full tensor of every parameter (or of its gradient; an undefined
// gradient gathers as zeros), on every rank. Collective over ctx.group: one
// all-gather per sharded parameter, in registration order.
torch::OrderedDict<std::string, at::Tensor> gather_full_parameters(const torch::nn::Module& root,
                                                                   const TpContext& ctx,
                                                                   Gather what = Gather::kValues);
// The same for tensors given by name (this rank's shards, e.g. read from
// somewhere other than the module's parameters: FSDP's full_parameters()),
// each laid out as `layout` says; out in the order given.
std::vector<std::pair<std::string, at::Tensor>> gather_full_tensors(
    const std::vector<std::pair<std::string, at::Tensor>>& local,
    const torch::OrderedDict<std::string, ShardSpec>& layout, const TpContext& ctx);

}  // namespace paratrain::tensor_parallel

// ShardLayout: who owns which elements when flat buffers of parameters are
// split evenly over the ranks of a data-parallel group (ZeRO, arXiv
// 1910.02054). Pure arithmetic on element counts: no tensors, no
// communication, so ZeRO-1/2 (one group per gradient bucket) and FSDP (one
// group per unit) cut their buffers the same way and checkpoints can name
// what each rank holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace paratrain::zero {

// One parameter inside a group's flat buffer: elements
// [offset, offset + numel) of the buffer are the parameter, row-major.
struct LayoutParam {
  std::size_t param = 0;  // index into the caller's parameter list
  int64_t numel = 0;
  int64_t offset = 0;
};

// One flat buffer: its parameters must not overlap and must fit in `numel`.
struct LayoutGroup {
  std::vector<LayoutParam> params;
  int64_t numel = 0;  // elements used; the buffer is padded past it
};

// What one rank holds of one parameter: elements
// [param_offset, param_offset + numel) of the flattened parameter live at
// [shard_offset, shard_offset + numel) of the rank's shard of `group`.
struct ShardPiece {
  std::size_t param = 0;
  std::size_t group = 0;
  int64_t param_offset = 0;
  int64_t shard_offset = 0;
  int64_t numel = 0;  // > 0: empty intersections are not listed
};

// Each group's buffer is padded with zeros to a multiple of `world`, and rank
// r owns the contiguous slice [r * shard_numel, (r + 1) * shard_numel) of it,
// the slice reduce_scatter delivers to rank r and all_gather collects from it.
// A parameter may straddle slices (then several ranks hold a piece of it) and
// a rank may hold nothing of a small group but padding.
class ShardLayout {
 public:
  ShardLayout() = default;
  // Throws ConfigError when world < 1 or a group's parameters overlap, have
  // negative sizes or spill past the group's numel.
  ShardLayout(std::vector<LayoutGroup> groups, int world);

  int world() const { return world_; }
  std::size_t num_groups() const { return groups_.size(); }
  const LayoutGroup& group(std::size_t g) const { return groups_.at(g); }
  // numel rounded up to a multiple of world().
  int64_t padded_numel(std::size_t g) const { return shard_numel(g) * world_; }
  // Elements of group g each rank holds (the same on every rank).
  int64_t shard_numel(std::size_t g) const { return shard_numel_.at(g); }

  // Rank r's pieces, group by group, in buffer order within each group.
  std::vector<ShardPiece> pieces(int rank) const;

 private:
  std::vector<LayoutGroup> groups_;
  std::vector<int64_t> shard_numel_;
  int world_ = 1;
};

}  // namespace paratrain::zero

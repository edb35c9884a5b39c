// ShardLayout: see shard_layout.h.
#include "paratrain/data_parallel/zero/shard_layout.h"

#include <algorithm>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::zero {
namespace {

void validate(const LayoutGroup& group, std::size_t g) {
  std::vector<LayoutParam> sorted = group.params;
  std::sort(sorted.begin(), sorted.end(),
            [](const LayoutParam& a, const LayoutParam& b) { return a.offset < b.offset; });
  int64_t end = 0;
  for (const LayoutParam& p : sorted) {
    if (p.numel < 0 || p.offset < 0) {
      throw ConfigError(fmt::format("shard layout: group {}: parameter {} has offset {} and numel {}; "
                                    "both must be >= 0",
                                    g, p.param, p.offset, p.numel));
    }
    if (p.offset < end) {
      throw ConfigError(fmt::format("shard layout: group {}: parameter {} at offset {} overlaps the "
                                    "previous parameter, which ends at {}",
                                    g, p.param, p.offset, end));
    }
    end = p.offset + p.numel;
  }
  if (end > group.numel) {
    throw ConfigError(fmt::format("shard layout: group {} declares {} elements but its parameters "
                                  "reach element {}",
                                  g, group.numel, end));
  }
}

}  // namespace

ShardLayout::ShardLayout(std::vector<LayoutGroup> groups, int world) : groups_(std::move(groups)), world_(world) {
  if (world_ < 1) throw ConfigError(fmt::format("shard layout: world = {}: must be >= 1", world_));
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    validate(groups_[g], g);
    shard_numel_.push_back((groups_[g].numel + world_ - 1) / world_);
  }
}

// A parameter occupies [offset, offset + numel) of its group's buffer and
// rank r owns [r * s, (r + 1) * s): the piece is their intersection.
std::vector<ShardPiece> ShardLayout::pieces(int rank) const {
  if (rank < 0 || rank >= world_) {
    throw ConfigError(fmt::format("shard layout: rank {} is outside a world of {}", rank, world_));
  }
  std::vector<ShardPiece> out;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const int64_t lo = rank * shard_numel_[g];
    const int64_t hi = lo + shard_numel_[g];
    std::vector<LayoutParam> params = groups_[g].params;
    std::sort(params.begin(), params.end(),
              [](const LayoutParam& a, const LayoutParam& b) { return a.offset < b.offset; });
    for (const LayoutParam& p : params) {
      const int64_t begin = std::max(lo, p.offset);
      const int64_t end = std::min(hi, p.offset + p.numel);
      if (begin >= end) continue;
      out.push_back({p.param, g, begin - p.offset, begin - lo, end - begin});
    }
  }
  return out;
}

}  // namespace paratrain::zero

// ParallelDims: see parallel_dims.h.
#include "paratrain/topology/parallel_dims.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::topology {

std::string_view to_string(Axis axis) {
  switch (axis) {
    case Axis::kPp: return "pp";
    case Axis::kDp: return "dp";
    case Axis::kCp: return "cp";
    case Axis::kTp: return "tp";
  }
  return "?";
}

ParallelDims ParallelDims::resolve(int64_t dp, int64_t tp, int64_t pp, int64_t cp, int world_size) {
  for (auto [key, v] : {std::pair{"parallel.tp", tp}, {"parallel.pp", pp}, {"parallel.cp", cp}}) {
    if (v < 1 || v > world_size) {
      throw ConfigError(fmt::format("{} = {} is not allowed: must be in [1, world_size({})]", key, v, world_size));
    }
  }
  if (dp < 0 || dp > world_size) {
    throw ConfigError(fmt::format("parallel.dp = {} is not allowed: must be 0 (= world / (tp * pp * cp)) or in "
                                  "[1, world_size({})]", dp, world_size));
  }
  const int64_t model_parallel = tp * pp * cp;
  if (dp == 0) {
    if (world_size % model_parallel != 0) {
      throw ConfigError(fmt::format(
          "world_size({}) is not divisible by tp({}) * pp({}) * cp({}) = {}, so parallel.dp cannot be derived: "
          "change parallel.tp/pp/cp or the number of ranks",
          world_size, tp, pp, cp, model_parallel));
    }
    dp = world_size / model_parallel;
  }
  ParallelDims d{static_cast<int>(dp), static_cast<int>(tp), static_cast<int>(pp), static_cast<int>(cp)};
  d.validate(world_size);
  return d;
}

int ParallelDims::size(Axis axis) const {
  switch (axis) {
    case Axis::kPp: return pp;
    case Axis::kDp: return dp;
    case Axis::kCp: return cp;
    case Axis::kTp: return tp;
  }
  return 1;
}

void ParallelDims::validate(int world_size) const {
  if (dp < 1 || tp < 1 || pp < 1 || cp < 1 || static_cast<int64_t>(dp) * tp * pp * cp != world_size) {
    throw ConfigError(fmt::format("{} != world_size({}): set parallel.dp, parallel.tp, parallel.pp and "
                                  "parallel.cp so that they multiply to the number of ranks",
                                  describe(), world_size));
  }
}

std::string ParallelDims::describe() const {
  return fmt::format("dp({}) * tp({}) * pp({}) * cp({})", dp, tp, pp, cp);
}

MeshCoords coords_of(const ParallelDims& dims, int rank) {
  MeshCoords c;
  for (auto it = kAxes.rbegin(); it != kAxes.rend(); ++it) {
    const int n = dims.size(*it);
    c.at[static_cast<int>(*it)] = rank % n;
    rank /= n;
  }
  return c;
}

int rank_of(const ParallelDims& dims, const MeshCoords& coords) {
  int rank = 0;
  for (Axis a : kAxes) rank = rank * dims.size(a) + coords[a];
  return rank;
}

}  // namespace paratrain::topology

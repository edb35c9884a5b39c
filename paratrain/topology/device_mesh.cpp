// DeviceMesh: see device_mesh.h.
#include "paratrain/topology/device_mesh.h"

#include <vector>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::topology {

DeviceMesh::DeviceMesh(comm::ProcessGroup& world, ParallelDims dims)
    : world_(world), dims_(dims) {
  dims_.validate(world_.size());
  coords_ = coords_of(dims_, world_.rank());
  for (Axis axis : kAxes) {
    const int a = static_cast<int>(axis);
    if (dims_.size(axis) == world_.size()) {
      groups_[a] = &world_;
      continue;
    }
    // new_subgroup is collective over the world: every rank creates every
    // group of this axis, in the same order, and keeps the one it is in.
    // A group is the ranks that share all coordinates but `axis`.
    std::vector<bool> done(world_.size(), false);
    for (int r = 0; r < world_.size(); ++r) {
      if (done[r]) continue;
      MeshCoords c = coords_of(dims_, r);
      std::vector<int> members;
      for (int i = 0; i < dims_.size(axis); ++i) {
        c.at[a] = i;
        const int m = rank_of(dims_, c);
        members.push_back(m);
        done[m] = true;
      }
      auto group = world_.new_subgroup(members);
      if (group) owned_[a] = std::move(group);
    }
    if (!owned_[a]) {
      throw Error(fmt::format("rank {}: device mesh: no {} group contains this rank; this is a bug",
                              world_.rank(), to_string(axis)));
    }
    groups_[a] = owned_[a].get();
  }
}

comm::ProcessGroup& DeviceMesh::group(Axis axis) const { return *groups_[static_cast<int>(axis)]; }

std::string DeviceMesh::describe() const {
  std::string out = fmt::format("rank {}:", world_.rank());
  for (Axis a : kAxes) out += fmt::format(" {} {}/{}", to_string(a), rank(a), size(a));
  return out;
}

}  // namespace paratrain::topology

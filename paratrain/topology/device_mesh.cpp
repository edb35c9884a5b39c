// DeviceMesh: see device_mesh.h.
#include "paratrain/topology/device_mesh.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "paratrain/comm/doctor/recording_group.h"
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
      // The hang doctor reports "all_reduce #12 on dp", not on "group".
      if (group) comm::name_group(*group, std::string(to_string(axis)));
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

std::shared_ptr<comm::ProcessGroup> DeviceMesh::new_joint_group(const std::vector<Axis>& axes) const {
  int span = 1;
  for (Axis a : axes) span *= dims_.size(a);
  if (span == world_.size()) return std::shared_ptr<comm::ProcessGroup>(&world_, [](comm::ProcessGroup*) {});
  // As in the constructor: every rank creates every such group, in the order
  // of their lowest rank, and keeps the one it is in.
  std::shared_ptr<comm::ProcessGroup> mine;
  std::vector<bool> done(world_.size(), false);
  for (int r = 0; r < world_.size(); ++r) {
    if (done[r]) continue;
    std::vector<int> members;
    for (int m = 0; m < world_.size(); ++m) {
      const MeshCoords a = coords_of(dims_, r), b = coords_of(dims_, m);
      bool same = true;
      for (Axis axis : kAxes) {
        const bool joined = std::find(axes.begin(), axes.end(), axis) != axes.end();
        if (!joined && a[axis] != b[axis]) same = false;
      }
      if (same) {
        members.push_back(m);
        done[m] = true;
      }
    }
    auto group = world_.new_subgroup(members);
    if (group) mine = std::move(group);
  }
  if (!mine) throw Error(fmt::format("rank {}: device mesh: no joint group contains this rank; this is a bug", world_.rank()));
  return mine;
}

std::string DeviceMesh::describe() const {
  std::string out = fmt::format("rank {}:", world_.rank());
  for (Axis a : kAxes) out += fmt::format(" {} {}/{}", to_string(a), rank(a), size(a));
  return out;
}

}  // namespace paratrain::topology

// DeviceMesh: the process groups of every parallel axis, built once from the
// world group and ParallelDims. All rank arithmetic lives here and in
// parallel_dims.h; strategies ask the mesh for "my dp group" and never
// compute ranks themselves. Not a device allocator: "device" follows the
// usual name (torch DeviceMesh); on CPU a rank is a process.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/topology/parallel_dims.h"

namespace paratrain::topology {

/// The world cut into dp x tp x pp x cp axes (ParallelDims), with one process
/// group per axis: what strategies combine (e.g. ZeRO over dp inside a
/// pipeline stage).
class DeviceMesh {
 public:
  /// Collective over `world`: every rank calls it with the same dims. Builds
  /// one sub-group per axis (the ranks that differ only in that axis). An
  /// axis spanning the whole world reuses `world`; `world` must outlive the
  /// mesh. Throws ConfigError when dims do not multiply to world.size().
  DeviceMesh(comm::ProcessGroup& world, ParallelDims dims);

  comm::ProcessGroup& world() const { return world_; }  ///< every rank
  const ParallelDims& dims() const { return dims_; }    ///< the axes' sizes
  comm::ProcessGroup& group(Axis axis) const;           ///< this rank's group along `axis`
  int rank(Axis axis) const { return coords_[axis]; }   ///< this rank's coordinate on `axis`
  int size(Axis axis) const { return dims_.size(axis); }  ///< ranks along `axis`
  const MeshCoords& coords() const { return coords_; }  ///< this rank's coordinates on every axis
  /// "rank 5: pp 1/2, dp 0/2, cp 0/1, tp 1/2"
  std::string describe() const;

  /// A group over several axes at once: the ranks that share every coordinate
  /// except those of `axes` (e.g. {kDp, kCp}: every replica of a tensor-
  /// parallel shard, which a strategy averages gradients over). Collective
  /// over the world: every rank calls it with the same axes, in the same
  /// order as its other group creations. A group spanning the whole world is
  /// the world itself (not owned). Members are listed in rank order.
  std::shared_ptr<comm::ProcessGroup> new_joint_group(const std::vector<Axis>& axes) const;

 private:
  comm::ProcessGroup& world_;
  ParallelDims dims_;
  MeshCoords coords_;
  std::array<std::shared_ptr<comm::ProcessGroup>, 4> owned_;
  std::array<comm::ProcessGroup*, 4> groups_{};
};

}  // namespace paratrain::topology

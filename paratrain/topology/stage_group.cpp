// new_stage_group: see stage_group.h.
#include "paratrain/topology/stage_group.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"

namespace paratrain::topology {

std::shared_ptr<comm::ProcessGroup> new_stage_group(const DeviceMesh& mesh, const std::vector<int>& stages) {
  const int pp = mesh.size(Axis::kPp);
  if (stages.empty() || !std::is_sorted(stages.begin(), stages.end()) ||
      std::adjacent_find(stages.begin(), stages.end()) != stages.end() || stages.front() < 0 ||
      stages.back() >= pp) {
    throw Error(fmt::format("device mesh: a stage group must list distinct stages in [0, {}) in increasing order, "
                            "got {{{}}}",
                            pp, fmt::join(stages, ", ")));
  }
  auto& world = mesh.world();
  // One group per combination of the other coordinates. pp is the outermost
  // axis, so ranks [0, world / pp) are stage 0 with every such combination.
  std::shared_ptr<comm::ProcessGroup> mine;
  for (int r = 0; r < world.size() / pp; ++r) {
    MeshCoords c = coords_of(mesh.dims(), r);
    std::vector<int> members;
    for (int s : stages) {
      c.at[static_cast<int>(Axis::kPp)] = s;
      members.push_back(rank_of(mesh.dims(), c));
    }
    auto group = world.new_subgroup(members);
    if (group) {
      comm::name_group(*group, "pp-stages");  // what the hang doctor reports
      mine = std::move(group);
    }
  }
  return mine;
}

}  // namespace paratrain::topology

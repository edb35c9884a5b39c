// Groups along the pipeline axis restricted to some stages. Megatron's
// "embedding group" is {0, pp - 1}: the first and last stage of each
// pipeline, which hold the two copies of a tied word embedding and sum their
// gradients (pipeline/tied.h). Rank arithmetic only; built from a DeviceMesh.
#pragma once

#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/topology/device_mesh.h"

namespace paratrain::topology {

/// The ranks that share every coordinate but pp with this rank and whose pp
/// coordinate is in `stages` (distinct, increasing, within [0, pp); Error
/// otherwise). Collective over mesh.world(): every rank calls it with the
/// same stages, in the same order as its other group creations. Ranks at
/// other stages get nullptr. Members are in rank order, which is stage order.
std::shared_ptr<comm::ProcessGroup> new_stage_group(const DeviceMesh& mesh, const std::vector<int>& stages);

}  // namespace paratrain::topology

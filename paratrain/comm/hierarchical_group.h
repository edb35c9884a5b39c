// Hierarchical all-reduce for jobs on several hosts with several ranks each:
// a ProcessGroup decorator whose all_reduce is
//   1. reduce to the node's leader over the node's group (shared memory, or
//      a sub-group of the world),
//   2. all-reduce among the leaders (one rank per node, over the world's
//      backend: only one rank per node crosses the network),
//   3. broadcast from the leader over the node's group.
// Every other operation (and new_subgroup) goes to the flat world group.
// Nodes are told apart by a name each rank brings (the host name; tests
// pass "node0", "node1" so threads of one process act as several nodes),
// exchanged over the world group. The leader is the node's lowest rank.
// See Note [Hierarchical all-reduce] in hierarchical_group.cpp.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

/// Where this rank sits among the job's nodes (all ranks in world ranks).
struct NodeLayout {
  std::string name;               ///< this rank's node name
  int node = 0;                   ///< this node's index (nodes in order of their lowest rank)
  int nodes = 1;                  ///< how many nodes
  std::vector<int> local_ranks;   ///< the world ranks on this node, increasing (the first leads)
  int local_rank = 0;             ///< index of this rank in local_ranks
  std::vector<int> leaders;       ///< every node's lowest world rank, by node index
  std::vector<int> node_of;       ///< every world rank's node index
};

/// Collective over `world`: every rank brings its node name (at most 255
/// bytes) and learns the layout.
NodeLayout node_layout(ProcessGroup& world, const std::string& node_name);

struct HierarchicalOptions {
  /// This rank's node name; empty: the host name.
  std::string node;
  /// Deadline of each phase of an all-reduce.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// Builds this node's group (ranks in local_ranks order, size
  /// local_ranks.size()), collective among the node's ranks only: e.g. a
  /// shared-memory group meeting through a store. Empty: a sub-group of the
  /// world (collective over the world: every rank builds every node's).
  std::function<std::shared_ptr<ProcessGroup>(const NodeLayout&)> make_node_group;
};

/// Collective over `world`: the layout, the node groups and the leaders'
/// group. The returned group keeps `world` alive and runs its all-reduces on
/// a thread of its own, one at a time in issue order (so every rank issues
/// the phases on the sub-groups in the same order).
std::shared_ptr<ProcessGroup> make_hierarchical_group(std::shared_ptr<ProcessGroup> world,
                                                      const HierarchicalOptions& options = {});

}  // namespace paratrain::comm

// What a tensor-parallel plan (parallelize/plan.h) attaches to a module it
// changed in place: LibTorch's C++ modules have no spare field and no
// forward hooks, so a plan keeps each module's state beside it, keyed by the
// module's address and checked against a weak reference (an address reused
// by a later module is never mistaken for the planned one).
// parameter_layout (shards.h) reads the shard specs of such modules, so a
// stock torch::nn::Linear whose weight a plan sliced is laid out like a
// ColumnParallelLinear.
// Not here: the plan itself and the sites that read the state (parallelize/).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/tensor_parallel/shards.h"

namespace paratrain::tensor_parallel {

class AttachedState {
 public:
  virtual ~AttachedState() = default;
  // The module's own (direct) parameters that are shards, by local name.
  virtual std::vector<std::pair<std::string, ShardSpec>> shard_specs() const = 0;
};

// Attaches `state` to `module` (owned by a shared_ptr, as every module in a
// tree is), replacing what was attached. Thread-safe.
void attach_state(const torch::nn::Module& module, std::shared_ptr<AttachedState> state);
// What is attached to `module`, or nullptr. Thread-safe; one shared lock.
std::shared_ptr<AttachedState> attached_state(const torch::nn::Module& module);

}  // namespace paratrain::tensor_parallel

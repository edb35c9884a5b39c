// Internal to parallelize/: the state a plan attaches to each module of the
// tree it applied to (Note [Plans in C++], plan.h).
#pragma once

#include <ATen/core/Generator.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/parallelize/plan.h"
#include "paratrain/tensor_parallel/attached.h"

namespace paratrain::parallelize::detail {

// One per applied plan, shared by its modules.
struct PlanState {
  PlanContext ctx;
  bool sequence_parallel = false;
  int64_t seq_dim = 1;
  bool defect_skip_input_gradient_sum = false;
  at::Generator region;  // this tp rank's in-region stream
  std::atomic<int64_t> entered{0};  // enter_sequence_parallel calls (sequence_parallel)
};

struct PlannedModule final : tensor_parallel::AttachedState {
  std::shared_ptr<PlanState> plan;
  std::string name;  // dotted, in the planned tree ("" for its root)
  StyleSpec style;
  bool named = false;  // a rule named it (else replicated by default)
  // Linear: full in/out features; Embedding: full rows in `out`.
  int64_t full_in = 0, full_out = 0;
  std::vector<std::pair<std::string, tensor_parallel::ShardSpec>> specs;
  std::atomic<int64_t> calls{0};  // forwards through a site

  std::vector<std::pair<std::string, tensor_parallel::ShardSpec>> shard_specs() const override { return specs; }
  // A style whose forward differs from the layer's own.
  bool runs_at_site() const {
    return style.style == Style::kColwise || style.style == Style::kRowwise ||
           style.style == Style::kVocabEmbedding;
  }
};

// The module's state, or nullptr.
std::shared_ptr<PlannedModule> planned(const torch::nn::Module& module);

}  // namespace paratrain::parallelize::detail

// Test helpers for DDP: the single-process oracle, the same training run on N
// ranks under DDP / the naive twin / no synchronization, and comparisons.
// Not a trainer: a plain SGD loop, small enough to read next to the tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/models/model.h"
#include "tests/support/forwarding_group.h"

namespace paratrain::ddp::testing {

// Test sizes (the MLP is 784-1024-1024-10; these are shrunk so a
// 4-rank run of 20 steps takes well under a second on 2 cores):
//   MLP: 8x8 inputs flattened -> 32 -> 32 -> 10,
//   CNN: 1x8x8 inputs, channels {4, 8}, hidden 16, 10 classes.
enum class ModelKind { kMlp, kCnn };
const char* to_string(ModelKind kind);

// Builds the model with torch::manual_seed(seed). The default generator is
// process-wide and ranks are threads, so construction is serialized.
std::shared_ptr<models::Model> make_model(ModelKind kind, uint64_t seed);

// A fixed dataset: `steps` global batches of `global_batch` rows each.
struct Problem {
  at::Tensor inputs;   // [steps * global_batch, 1, 8, 8]
  at::Tensor targets;  // [steps * global_batch], classes 0..9
  int steps = 0;
  int64_t global_batch = 0;
  at::Tensor batch_inputs(int step) const;
  at::Tensor batch_targets(int step) const;
};
Problem make_problem(int steps, int64_t global_batch, uint64_t seed);

// Rank r's share of a global batch: the contiguous rows
// [r * B / world, (r + 1) * B / world). B must be divisible by world.
at::Tensor shard(const at::Tensor& batch, int rank, int world);

struct SgdConfig {
  double lr = 0.05;
  double momentum = 0.9;
};

// Parameters after training: name and a detached clone of the values.
using Snapshot = std::vector<std::pair<std::string, at::Tensor>>;
Snapshot snapshot(torch::nn::Module& module);

// The oracle: one process, full global batch per step, mean cross-entropy.
Snapshot train_single_process(ModelKind kind, const Problem& problem, uint64_t seed, SgdConfig sgd = {});

enum class Sync { kDdp, kNaive, kNone };
struct RankRun {
  ModelKind model = ModelKind::kMlp;
  int world = 2;
  Sync sync = Sync::kDdp;
  DdpOptions ddp;
  // Rank r builds its model with seed + r when true (construction must then
  // broadcast rank 0's parameters), with seed on every rank otherwise.
  bool different_seeds = true;
  uint64_t seed = 1234;
  SgdConfig sgd;
  // Called on each rank before DDP is built (e.g. to give each rank its own
  // stateful comm hook); the function it returns, if any, runs on the built
  // DDP (e.g. PowerSgd::attach).
  std::function<std::function<void(DistributedDataParallel&)>(DdpOptions&)> per_rank;
};
// Trains problem.steps steps on `world` ranks (threads), each on its shard.
// Returns each rank's final parameters, indexed by rank.
std::vector<Snapshot> train_ranks(const RankRun& run, const Problem& problem);

// max |a - b| / max |b| over each pair of tensors with the same name; the
// worst tensor's value. Relative to the tensor's scale rather than per element,
// so entries near zero do not dominate. Prints the value to stderr when the
// environment has DDP_TEST_PRINT set (to see the margin to a tolerance).
double max_relative_diff(const Snapshot& a, const Snapshot& b);
// Bitwise equality of all tensors.
bool identical(const Snapshot& a, const Snapshot& b);

// DdpOptions with the given bucket caps (bytes), everything else default.
DdpOptions with_caps(int64_t first_bucket_cap, int64_t bucket_cap);

// Forwards every call to `inner` and counts all_reduce calls (other collectives
// are not counted), to check when the reducer communicates.
class CountingGroup final : public paratrain::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  int all_reduces() const { return all_reduces_.load(); }
  comm::WorkHandle all_reduce(at::Tensor& t, comm::ReduceOp op) override {
    ++all_reduces_;
    return ForwardingGroup::all_reduce(t, op);
  }

 private:
  std::atomic<int> all_reduces_{0};
};

}  // namespace paratrain::ddp::testing

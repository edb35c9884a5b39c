// Test helpers for FSDP: the same training run as tests/ddp/training.h's
// oracle, on N ranks (threads) under FullyShardedDataParallel, with any
// LibTorch optimizer, optional clipping and no_sync accumulation. Reuses
// Problem, make_model, snapshot and max_relative_diff from tests/ddp.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "tests/ddp/training.h"

namespace paratrain::fsdp::testing {

using ddp::testing::ModelKind;
using ddp::testing::Problem;
using ddp::testing::Snapshot;

enum class Opt { kSgd, kAdam, kAdamW };
const char* to_string(Opt opt);
// SGD: lr 0.05, momentum 0.9 (as the DDP oracle); Adam/AdamW: lr 0.01.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<at::Tensor> params);

struct OracleOptions {
  Opt opt = Opt::kSgd;
  double clip = 0;  // > 0: torch::nn::utils::clip_grad_norm_ before each step
  std::vector<double>* norms = nullptr;  // when set, the norm of each step
};
// One process, full global batch per step, mean cross-entropy.
Snapshot train_oracle(ModelKind kind, const Problem& problem, uint64_t seed, const OracleOptions& options);

struct FsdpRun {
  ModelKind model = ModelKind::kMlp;
  int world = 2;
  FsdpOptions fsdp;
  Opt opt = Opt::kSgd;
  double clip = 0;
  int accumulate = 1;  // micro-batches per step, the first accumulate-1 under no_sync
  uint64_t seed = 1234;
  // Optional: wraps each rank's group (e.g. to break a collective).
  std::function<std::unique_ptr<comm::ProcessGroup>(comm::ProcessGroup&)> wrap_group;
  // Optional: called on each rank after training, before the result is taken.
  std::function<void(FullyShardedDataParallel&, torch::optim::Optimizer&, int rank)> inspect;
};
struct RankResult {
  Snapshot params;         // full_parameters() after training
  FsdpStats stats;
  std::vector<double> norms;  // clip_grad_norm() per step when clip > 0
};
// Rank r builds its model from seed + r (construction takes rank 0's values)
// and trains on its contiguous shard of each global batch.
std::vector<RankResult> train_fsdp(const FsdpRun& run, const Problem& problem);

}  // namespace paratrain::fsdp::testing

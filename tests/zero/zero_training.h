// Test helpers for ZeRO: the single-process oracle with any of the tests'
// optimizers (plus clipping), and the same run on N ranks (threads) under
// ZeroDataParallel, with switches for gradient accumulation and for the
// negative controls. Models, problems and comparisons come from
// tests/ddp/training.h. Not a trainer: plain loops, readable next to the tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "paratrain/data_parallel/zero/zero.h"
#include "tests/ddp/training.h"

namespace torch::optim {
class Optimizer;
}

namespace paratrain::zero::testing {

using ddp::testing::ModelKind;
using ddp::testing::Problem;
using ddp::testing::Snapshot;

enum class Optim { kSgd, kAdam, kAdamW };
const char* to_string(Optim optim);

// SGD: lr 0.05, momentum 0.9 (as the DDP tests). Adam / AdamW: lr 0.01,
// AdamW with weight decay 0.1 so the decoupled decay is exercised.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optim optim, std::vector<at::Tensor> params);

struct Training {
  ModelKind model = ModelKind::kMlp;
  Optim optim = Optim::kSgd;
  uint64_t seed = 1234;
  // > 0: clip the global gradient norm to this before every step.
  double clip = 0;
  double norm_type = 2.0;  // of the clipping norm: 2 or infinity
};

// The oracle: one process, the full global batch per step, mean cross-entropy.
// `norms` (optional) receives the gradient norm before clipping, per step.
Snapshot train_oracle(const Training& t, const Problem& problem, std::vector<double>* norms = nullptr);

struct ZeroRun {
  int world = 2;
  ZeroOptions zero;
  // Micro-batches per step: the first accumulate-1 run under no_sync(), each
  // with loss / accumulate, so the sum is the gradient of the shard's mean.
  int accumulate = 1;
  // Negative control: optimizer.step() on the shard without the all-gather,
  // so the model's parameters never see the update.
  bool skip_gather = false;
  // After each step, set every .grad to None (optimizer pieces and the full
  // parameters), as LibTorch 2.x's zero_grad() does by default, instead of
  // zeroing in place (LibTorch 1.13's zero_grad()).
  bool set_grads_to_none = false;
};

struct ZeroResult {
  std::vector<Snapshot> params;             // per rank, final full parameters
  std::vector<double> norms;                // rank 0's clip_grad_norm() per step (when clipping)
  std::vector<ModelStateBytes> state;       // per rank, after the last step
  std::vector<int64_t> shard_numel;         // per rank, elements in optimizer_params()
  std::vector<int64_t> bucket_numel;        // per rank, padded elements of all gradient buckets
};
// Rank r builds its model from seed + r (construction broadcasts rank 0's).
ZeroResult train_zero(const Training& t, const ZeroRun& run, const Problem& problem);

// The DDP test's SGD settings, as the ZeRO runs use them.
ddp::testing::SgdConfig sgd_config();

}  // namespace paratrain::zero::testing

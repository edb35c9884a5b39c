// A test model with an optional branch and a buffer, for DDP's unused-
// parameter and buffer tests, plus its training loop under DDP and the
// single-process oracle of that loop. Not a model for anything else.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <vector>

#include "tests/ddp/training.h"

namespace paratrain::ddp::testing {

// body -> [+ extra(h)] -> head; `stat` is a buffer each forward moves by the
// batch mean (like BatchNorm's running statistics, it differs between ranks
// unless broadcast). Parameters: body.*, extra.*, head.*.
struct TwoHeadNetImpl : torch::nn::Module {
  TwoHeadNetImpl();
  at::Tensor forward(const at::Tensor& x, bool use_extra);
  torch::nn::Linear body{nullptr}, extra{nullptr}, head{nullptr};
  at::Tensor stat;
};
TORCH_MODULE(TwoHeadNet);

// Built under torch::manual_seed(seed), serialized across rank threads.
TwoHeadNet make_two_head(uint64_t seed);

// Mean cross-entropy on rank `rank`'s shard of the step's global batch.
at::Tensor loss_of(TwoHeadNet& net, const Problem& p, int step, int rank, int world, bool use_extra);

// Trains under DDP (SGD, lr 0.05, momentum 0.9); rank r builds its net from
// seed + r and uses the extra branch iff use_extra(r). Returns each rank's
// final parameters.
std::vector<Snapshot> train_two_head(int world, const DdpOptions& options, const Problem& p, uint64_t seed,
                                     const std::function<bool(int)>& use_extra);

// The oracle of train_two_head: one process computes every shard's loss with
// that shard's branch choice and averages them, which is exactly what "an
// unused parameter contributes zero, gradients are averaged over ranks" means.
Snapshot two_head_oracle(int world, const Problem& p, uint64_t seed, const std::function<bool(int)>& use_extra);

}  // namespace paratrain::ddp::testing

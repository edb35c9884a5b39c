// One simulated client's local training in a round: start from the global
// model, run its own optimizer over its own rows for some epochs or steps
// (FedProx adds a proximal term), clip gradients, and return the update
// x_local - x_global with the client's sample count. Runs on whichever rank
// hosts the client; the model object is borrowed and left holding the local
// weights (the caller reloads the global ones). Not the round (round.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "paratrain/data/dataset.h"

namespace torch::optim {
class Optimizer;
}
namespace paratrain::models {
class Model;
}

namespace paratrain::federated {

struct LocalTrainingOptions {
  int64_t epochs = 1;      // passes over the client's rows
  int64_t steps = 0;       // > 0: exactly this many mini-batches instead (cycling over reshuffled passes)
  int64_t batch_size = 32; // capped at the client's row count; the last batch of a pass may be smaller
  // FedProx (Li et al., arXiv 1812.06127): the local objective is
  // loss + mu/2 ||w - w_global||^2, whose gradient adds mu (w - w_global).
  double prox_mu = 0.0;
  double clip_grad_norm = 0.0;  // > 0: the client's gradient (with the prox term) is clipped to this L2 norm
  uint64_t seed = 0;            // the client's shuffles this round
};

struct ClientUpdate {
  at::Tensor delta;     // flat float32: x_local - x_global, in parameter order
  int64_t samples = 0;  // rows the client holds (FedAvg's weight)
  int64_t steps = 0;    // optimizer steps taken
  double loss = 0.0;    // mean training loss over those steps
};

// Trains `model` (whose parameters are set to `global` first) on `data`
// with `optimizer`, built over model.parameters(): a fresh one per round (as
// in FedAvg), or the client's own from earlier rounds, whose state (momentum,
// Adam's moments and step) it continues.
ClientUpdate train_client(models::Model& model, const at::Tensor& global, const data::TensorDataset& data,
                          torch::optim::Optimizer& optimizer, const LocalTrainingOptions& options);

// The model's parameters as one flat float32 vector (a copy), and back.
at::Tensor flatten_parameters(models::Model& model);
void load_flat_parameters(models::Model& model, const at::Tensor& flat);

}  // namespace paratrain::federated

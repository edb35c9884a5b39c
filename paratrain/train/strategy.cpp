// Strategy helpers shared by every adapter (the interface is strategy.h).
#include "paratrain/train/strategy.h"

#include <torch/torch.h>

#include "paratrain/train/checkpoint/optimizer_state.h"

namespace paratrain::train {

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  // torch::optim's per-parameter state has no generic tensor accessor; the
  // checkpoint adapters already list every state tensor of each optimizer.
  const OptimizerStateIo& io = optimizer_state_io(optimizer, "<memory accounting>");
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    for (const auto& [field, t] : io.save(*state)) bytes += t.numel() * t.element_size();
  }
  return bytes;
}

}  // namespace paratrain::train

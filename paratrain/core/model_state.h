// Bytes of model state a rank holds (ZeRO's Psi accounting: parameters,
// gradients, optimizer state), counted from tensors actually alive, for the
// Trainer's metrics, benchmarks and memory tests of every strategy. Not a memory profiler: activations and
// allocator slack are not counted.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace paratrain {

struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer_state = 0;
  // The paper's model states: what sharding divides.
  int64_t total() const { return params + grads + optimizer_state; }
  // Communication buffers held between steps (the reducer's gradient
  // buckets), reported apart from total(): ZeRO-2 saves gradient memory only
  // as far as these are transient.
  int64_t comm_buffers = 0;
};

// Bytes of the defined tensors in `tensors`, each storage counted once (views
// and aliases of one buffer do not count twice).
int64_t tensor_bytes(const std::vector<at::Tensor>& tensors);

// The tensors of every per-parameter state `optimizer` holds (SGD momentum,
// Adam/AdamW moments, Adagrad sums, RMSprop averages). Throws Error for a state
// type it does not know, rather than under-counting silently.
std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer);

}  // namespace paratrain

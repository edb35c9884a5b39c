// Bytes of model state a rank holds (ZeRO's Psi accounting: parameters,
// gradients, optimizer state), counted from tensors actually alive, for
// benchmarks and memory tests. Not a memory profiler: activations, bucket
// buffers of the reducer and allocator slack are not counted.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace paratrain::zero {

struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer_state = 0;
  int64_t total() const { return params + grads + optimizer_state; }
};

// Bytes of the defined tensors in `tensors`, each storage counted once (views
// and aliases of one buffer do not count twice).
int64_t tensor_bytes(const std::vector<at::Tensor>& tensors);

// The tensors of every per-parameter state `optimizer` holds (SGD momentum,
// Adam/AdamW moments, Adagrad sums, RMSprop averages). Throws Error for a state
// type it does not know, rather than under-counting silently.
std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer);

}  // namespace paratrain::zero

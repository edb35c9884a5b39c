// Adam and AdamW that step all of a parameter group's tensors with
// LibTorch's multi-tensor (_foreach_) kernels: a few launches per group
// instead of about eight per parameter, which on a GPU otherwise leaves the
// device idle while the host launches them one by one (PyTorch's Python
// optimizers do the same by default). The arithmetic per element is that of
// torch::optim::Adam / AdamW::step, in the same order, and the state is
// theirs (AdamParamState / AdamWParamState: checkpoints are unchanged). On
// the CPU the results are bitwise theirs (tests/optim/foreach_adam_test.cpp).
// amsgrad falls back to the parent's step.
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

namespace paratrain::optim {

/// torch::optim::Adam, stepped with multi-tensor kernels.
class ForeachAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

/// torch::optim::AdamW, stepped with multi-tensor kernels.
class ForeachAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace paratrain::optim

// The base class of paratrain's models: a torch::nn::Module with a single
// tensor-in, tensor-out forward, so strategies (DDP, the Trainer) can hold any
// model by pointer. Not a layer library: concrete models live in mlp.h, cnn.h.
#pragma once

#include <string>
#include <utility>

#include <torch/nn/module.h>

namespace paratrain::models {

class Model : public torch::nn::Module {
 public:
  // Returns logits for a batch; the first dimension of x is the batch.
  virtual at::Tensor forward(const at::Tensor& x) = 0;

 protected:
  Model() = default;
  // The name shows up in Module::name() and printing; a fixed name keeps it
  // independent of the compiler's demangling of the concrete class.
  explicit Model(std::string name) : torch::nn::Module(std::move(name)) {}
};

}  // namespace paratrain::models

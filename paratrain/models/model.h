// The base class of paratrain's models: a torch::nn::Module with a single
// tensor-in, tensor-out forward, so strategies (DDP, the Trainer) can hold any
// model by pointer. Not a layer library: concrete models live in mlp.h, cnn.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

namespace paratrain::models {

/// One unit a pipeline can place on a stage: the submodules it owns, under
/// the names the model registered them with (so a stage's parameters keep the
/// single-process names: fc3.weight), and its forward. The forward captures
/// the submodules, never the model, so a stage may drop the rest of the model.
/// Layers are row-wise: example i of the output depends only on example i of
/// the input, which lets a pipeline split a batch into micro-batches.
struct Layer {
  std::string name;  ///< for partition logs ("fc3")
  /// The submodules it owns, under the names the model registered them with
  /// (a dotted path such as "blocks.3" for a module inside a container). A
  /// module two layers share (a tied weight: the GPT's wte in its embedding
  /// and its head) is listed by both under the same name; a pipeline keeps a
  /// copy on each stage and sums their gradients (pipeline/tied.h).
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  std::function<at::Tensor(const at::Tensor&)> forward;  ///< this layer's share of the model's forward
  /// Modules that an earlier layer owns whose parameters this forward reads
  /// too (a tied weight: GPT's head reads wte), named as in `modules`. A
  /// pipeline cannot put such a layer on another stage than the owner (it
  /// rejects the model); parameter servers wait for them before this layer.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> reads = {};
};

/// What the Trainer trains: a module mapping a batch to logits, optionally cut
/// into layers for pipelines. User models derive from it and are registered
/// with register_model() (train/registry.h).
class Model : public torch::nn::Module {
 public:
  /// Returns logits for a batch; the first dimension of x is the batch.
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  /// The model as a sequence of layers whose composition is forward(), for
  /// pipeline partitioning and for waiting on parameters layer by layer
  /// (parameter servers); empty when the model cannot be cut.
  virtual std::vector<Layer> layers() { return {}; }

 protected:
  Model() = default;
  /// The name shows up in Module::name() and printing; a fixed name keeps it
  /// independent of the compiler's demangling of the concrete class.
  explicit Model(std::string name) : torch::nn::Module(std::move(name)) {}
};

}  // namespace paratrain::models

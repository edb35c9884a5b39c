// A pipeline chunk: a contiguous run of a model's layers (models::Layer),
// registered under the model's own names so parameters keep their
// single-process names (fc3.weight) in optimizers and checkpoints. Not the
// partitioning (partition.h) or the schedule that runs chunks (executor.h).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "paratrain/models/model.h"

namespace paratrain::pipeline {

class StageModule : public torch::nn::Module {
 public:
  // `layers`: the chunk's layers in order, at least one. `segment_of`: the
  // activation checkpointing segment of each layer (models/recompute.h: the
  // chunk's slice of recompute_segments(); empty = none), `generators` the
  // random streams the layers draw from besides the default one.
  explicit StageModule(std::vector<models::Layer> layers, std::vector<int> segment_of = {},
                       std::vector<at::Generator> generators = {});

  // Runs the layers in order, the recomputed segments through
  // models::run_layers. Adds to `activation_bytes` when given what autograd
  // keeps alive for backward, roughly: every plain layer's output (each
  // layer saves its input or output) and every recomputed segment's input.
  at::Tensor forward(const at::Tensor& x, int64_t* activation_bytes = nullptr);

  const std::vector<models::Layer>& layers() const { return layers_; }
  // The random streams the layers draw from besides the default one.
  const std::vector<at::Generator>& generators() const { return generators_; }
  // "fc2..fc4": for logs.
  std::string describe() const;

 private:
  std::vector<models::Layer> layers_;
  std::vector<int> segment_of_;
  std::vector<at::Generator> generators_;
};

// Module names may be dotted paths ("blocks.3"): plain container modules are
// made for the parts before the last, so parameter names match the model's.
// Registers every module of `chunks` under its model name, so one module's
// named_parameters() lists a rank's parameters as the single-process model
// names them (a rank holding chunks 0 and 2 of interleaved 1F1B included).
std::shared_ptr<torch::nn::Module> merge_chunks(const std::vector<std::shared_ptr<StageModule>>& chunks);

// The per-example shape of each layer boundary: shapes[i] is the input of
// layer i, shapes[layers.size()] the model's output. Runs the layers once on
// one zero example (no grad), so every rank derives the same shapes from the
// config alone, without messages. Layers must be row-wise (model.h).
// `input_dtype`: the model's input (kLong for token ids: zero is a valid id).
struct BoundaryShapes {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::ScalarType> dtypes;
};
BoundaryShapes infer_boundary_shapes(const std::vector<models::Layer>& layers,
                                     const std::vector<int64_t>& example_shape,
                                     at::ScalarType input_dtype = at::kFloat);

// Where a module's tensors live: its first parameter's (or buffer's) device,
// the CPU when it has neither.
c10::Device stage_device(const torch::nn::Module& module);
c10::Device layers_device(const std::vector<models::Layer>& layers);

// Parameter elements per layer (balancing by parameters).
std::vector<double> layer_parameter_counts(const std::vector<models::Layer>& layers);

// The loss of the model's output (targets of the caller's choosing): the
// part of a step that runs on the last stage after its last layer.
using OutputLoss = std::function<at::Tensor(const at::Tensor& output)>;

// Forward + backward seconds of each layer on a micro-batch of `rows`, as a
// pipeline step runs them (balancing by time): the model's input needs no
// gradient, so layer 0 computes none for it, and the last layer's time
// includes `loss` of its output and its backward, which only the last stage
// pays. Without either the cut favours the wrong stage: an MLP's first layer
// costs 2/3 of the others and the loss can cost more than a layer (a large
// vocabulary). One unmeasured round over the layers (allocation), then the
// best of `repeats` rounds per layer (the least disturbed by other
// processes). Draws from a generator of its own; leaves every parameter's
// gradient undefined.
std::vector<double> measure_layer_times(const std::vector<models::Layer>& layers, const BoundaryShapes& shapes,
                                        int64_t rows, const OutputLoss& loss, int repeats = 5);

}  // namespace paratrain::pipeline

// A multi-layer perceptron: flatten, then Linear+ReLU per hidden layer and a
// final Linear producing logits (no softmax: pair it with cross_entropy).
// Parameters are named fc0.weight, fc0.bias, ..., fc<N>.* in layer order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "paratrain/models/model.h"

namespace paratrain::models {

struct MlpOptions {
  // Features per example after flattening (28*28 for Fashion-MNIST).
  int64_t in_features = 784;
  // Width of each hidden layer; empty gives a linear (softmax-regression) model.
  // Wider layers learn faster per step but make gradient exchange costlier.
  std::vector<int64_t> hidden{1024, 1024};
  // Number of classes (width of the logits).
  int64_t out_features = 10;
};

// Initialisation draws from torch's default generator: deterministic after
// torch::manual_seed. Throws c10::Error on non-positive sizes.
std::shared_ptr<Model> make_mlp(const MlpOptions& options);

}  // namespace paratrain::models

// Turns config sections into LibTorch objects: the optimizer and the
// train/test datasets. The Trainer composes them; tests reuse them to build
// single-process oracles from the same config.
#pragma once

#include <memory>
#include <vector>

#include "paratrain/data/dataset.h"
#include "paratrain/train/config.h"

namespace torch::optim {
class Optimizer;
}
namespace at {
class Tensor;
}

namespace paratrain::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<at::Tensor>& params);

struct Datasets {
  data::TensorDataset train;
  data::TensorDataset test;
};
// Fashion-MNIST from data.dir, or the synthetic task (train and test drawn
// from the same teacher with different seeds).
Datasets load_datasets(const TrainConfig& config);

}  // namespace paratrain::train

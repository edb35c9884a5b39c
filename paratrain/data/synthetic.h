// Synthetic datasets for tests and benchmarks: Gaussian inputs labelled by a
// fixed random linear "teacher", so a model can learn them and a test can
// tell learning from noise. Deterministic from seeds; never touches the
// global torch RNG (so building data cannot shift a model's initialization).
#pragma once

#include <cstdint>
#include <vector>

#include "paratrain/data/dataset.h"

namespace paratrain::data {

enum class SyntheticTask {
  kClassification,  // targets: int64 [N], argmax of the teacher's logits
  kRegression,      // targets: float32 [N, num_classes], the teacher's outputs (+ noise)
};

struct SyntheticOptions {
  int64_t num_samples = 1024;
  // Shape of one input: {D} for flat vectors (MLPs), {C, H, W} for images
  // (CNNs). The teacher sees the flattened input either way.
  std::vector<int64_t> input_shape = {32};
  // Classification: number of classes. Regression: width of each target.
  int64_t num_classes = 10;
  SyntheticTask task = SyntheticTask::kClassification;
  // Seeds the inputs (and regression noise): a train and a test split use
  // different seeds and the same teacher_seed.
  uint64_t seed = 0;
  // Seeds the teacher, i.e. which function is to be learned.
  uint64_t teacher_seed = 1234;
  // Regression only: std of Gaussian noise added to targets. 0 = exactly
  // learnable, so a test may expect the loss to approach 0.
  double noise_std = 0.0;
};

// inputs: float32 [num_samples, input_shape...] ~ N(0, 1).
// Classification labels are roughly balanced but not exactly.
TensorDataset make_synthetic(const SyntheticOptions& options);

}  // namespace paratrain::data

// Synthetic data: x ~ N(0, I), teacher W ~ N(0, 1/D), b ~ N(0, 0.1^2);
// classification takes argmax(W x + b), regression W x + b (+ noise).
#include "paratrain/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>

#include "paratrain/core/error.h"

namespace paratrain::data {

TensorDataset make_synthetic(const SyntheticOptions& options) {
  TORCH_CHECK(options.num_samples >= 0, "SyntheticOptions.num_samples must be >= 0, got ",
              options.num_samples);
  TORCH_CHECK(!options.input_shape.empty(), "SyntheticOptions.input_shape must not be empty");
  int64_t features = 1;
  for (const int64_t d : options.input_shape) {
    TORCH_CHECK(d > 0, "SyntheticOptions.input_shape must be positive, got [",
                fmt::format("{}", fmt::join(options.input_shape, ", ")), "]");
    features *= d;
  }
  TORCH_CHECK(options.num_classes >= 1, "SyntheticOptions.num_classes must be >= 1, got ",
              options.num_classes);
  TORCH_CHECK(options.noise_std >= 0, "SyntheticOptions.noise_std must be >= 0");

  // Our own generators: the global one (torch::manual_seed) stays untouched.
  at::Generator data_gen = at::detail::createCPUGenerator(options.seed);
  at::Generator teacher_gen = at::detail::createCPUGenerator(options.teacher_seed);

  std::vector<int64_t> shape = {options.num_samples};
  shape.insert(shape.end(), options.input_shape.begin(), options.input_shape.end());
  const at::Tensor inputs = at::randn(shape, data_gen, at::TensorOptions().dtype(at::kFloat));

  // The teacher runs in float64 so that labels do not depend on BLAS
  // rounding (thread count, library): an argmax near a tie would otherwise
  // flip between machines.
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor weight =
      at::randn({options.num_classes, features}, teacher_gen, f64).div_(std::sqrt(double(features)));
  const at::Tensor bias = at::randn({options.num_classes}, teacher_gen, f64).mul_(0.1);
  const at::Tensor outputs =
      at::addmm(bias, inputs.reshape({options.num_samples, features}).to(at::kDouble), weight.t());

  if (options.task == SyntheticTask::kClassification) {
    return TensorDataset(inputs, outputs.argmax(1));
  }
  at::Tensor targets = outputs.to(at::kFloat);
  if (options.noise_std > 0) {
    targets.add_(at::randn(targets.sizes(), data_gen, targets.options()).mul_(options.noise_std));
  }
  return TensorDataset(inputs, targets);
}

}  // namespace paratrain::data

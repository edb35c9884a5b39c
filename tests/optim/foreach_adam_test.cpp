// ForeachAdam / ForeachAdamW (optim/foreach_adam.h): the multi-tensor step
// is bitwise torch::optim::Adam / AdamW's on the CPU, with two parameter
// groups (their own lr and weight decay), a parameter that gets no gradient
// on some steps (its step count lags), and the state the parent reads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "paratrain/core/compat.h"
#include "paratrain/optim/foreach_adam.h"

namespace paratrain::optim {
namespace {

std::vector<at::Tensor> make_params() {
  torch::manual_seed(3);
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{{7, 5}, {5}, {3, 4, 2}, {11}})
    out.push_back(torch::randn(shape).requires_grad_(true));
  return out;
}

template <class Reference, class Ours, class Options, class State>
void expect_bitwise_equal(bool amsgrad = false) {
  auto a = make_params();
  auto b = make_params();
  auto groups = [amsgrad](std::vector<at::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<at::Tensor>{p[0], p[1]},
                   std::make_unique<Options>(Options(1e-2).weight_decay(0.1).amsgrad(amsgrad)));
    g.emplace_back(std::vector<at::Tensor>{p[2], p[3]},
                   std::make_unique<Options>(Options(3e-3).weight_decay(0.0).amsgrad(amsgrad)));
    return g;
  };
  Reference reference(groups(a), Options(1e-3).amsgrad(amsgrad));
  Ours ours(groups(b), Options(1e-3).amsgrad(amsgrad));
  torch::manual_seed(11);
  for (int step = 0; step < 12; ++step) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      // Parameter 3 gets no gradient on odd steps: its step count lags.
      if (i == 3 && step % 2 == 1) {
        a[i].mutable_grad().reset();
        b[i].mutable_grad().reset();
        continue;
      }
      const at::Tensor g = torch::randn(a[i].sizes());
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    reference.step();
    ours.step();
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
    const auto& sa = static_cast<State&>(*reference.state().at(compat::optimizer_state_key(a[i])));
    const auto& sb = static_cast<State&>(*ours.state().at(compat::optimizer_state_key(b[i])));
    EXPECT_EQ(sa.step(), sb.step()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(sa.exp_avg(), sb.exp_avg())) << "parameter " << i;
    EXPECT_TRUE(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << "parameter " << i;
  }
  // Control: the parameters moved (the comparison is not of untouched tensors).
  EXPECT_FALSE(torch::equal(a[0], make_params()[0]));
}

// Control: the step really runs the multi-tensor kernels (a parent's step
// would pass the equality tests too): the dispatcher reports _foreach_ ops.
std::atomic<int> g_foreach_ops{0};
std::unique_ptr<at::ObserverContext> count_foreach(const at::RecordFunction& fn) {
  if (std::strstr(fn.name(), "_foreach_") != nullptr) ++g_foreach_ops;
  return nullptr;
}

TEST(ForeachAdam, TheStepRunsMultiTensorKernels) {
  auto params = make_params();
  for (auto& p : params) p.mutable_grad() = torch::ones_like(p);
  ForeachAdamW ours(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  torch::optim::AdamW reference(make_params(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  for (auto& p : reference.param_groups()[0].params()) p.mutable_grad() = torch::ones_like(p);
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&count_foreach));
  g_foreach_ops = 0;
  reference.step();
  EXPECT_EQ(g_foreach_ops.load(), 0) << "torch's AdamW steps tensor by tensor";
  ours.step();
  EXPECT_GE(g_foreach_ops.load(), 6) << "weight decay, two moments, sqrt, division, eps, update";
  at::removeCallback(handle);
}

TEST(ForeachAdam, AdamWIsBitwiseTorchsAdamW) {
  expect_bitwise_equal<torch::optim::AdamW, ForeachAdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>();
}

TEST(ForeachAdam, AdamIsBitwiseTorchsAdam) {
  expect_bitwise_equal<torch::optim::Adam, ForeachAdam, torch::optim::AdamOptions, torch::optim::AdamParamState>();
}

TEST(ForeachAdam, AmsgradFallsBackToTheParentsStep) {
  expect_bitwise_equal<torch::optim::AdamW, ForeachAdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
      /*amsgrad=*/true);
}

}  // namespace
}  // namespace paratrain::optim

// Lamb against the paper's Algorithm 2 (arXiv 1904.00962) written out here
// with plain tensor ops, one and three steps; excluded groups against
// torch::optim::AdamW; zero norms and the phi clamp; save/load round trip.
//
// Tolerance: 1e-6 relative on the update (w_after - w_before), in float64, as
// in lars_test.cpp (measured ~1e-15). Negative control: the ratio forced to 1
// (AdamW's step) misses the reference by more than 0.5.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "paratrain/core/compat.h"
#include "paratrain/core/model_state.h"
#include "paratrain/optim/lamb.h"
#include "tests/optim/optim_testing.h"

namespace paratrain::optim {
namespace {

using namespace testing;

// Algorithm 2 per tensor: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// r = m_hat / (sqrt(v_hat) + eps) + wd w; w -= lr phi(||w||)/||r|| r
// (phi = identity here; ratio 1 if a norm is 0 or the tensor is excluded).
struct LambReference {
  double lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-6;
  std::vector<double> weight_decay;
  std::vector<bool> excluded;
  std::vector<at::Tensor> w, m, v;
  int t = 0;

  LambReference(const std::vector<at::Tensor>& params, double wd, std::vector<bool> excl)
      : weight_decay(params.size(), wd), excluded(std::move(excl)), w(detached_copies(params)) {
    for (const auto& p : w) {
      m.push_back(at::zeros_like(p));
      v.push_back(at::zeros_like(p));
    }
  }
  void step(const std::vector<at::Tensor>& grads) {
    ++t;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const at::Tensor& g = grads[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const at::Tensor m_hat = m[i] / (1 - std::pow(b1, t));
      const at::Tensor v_hat = v[i] / (1 - std::pow(b2, t));
      const at::Tensor r = m_hat / (v_hat.sqrt() + eps) + weight_decay[i] * w[i];
      const double wn = w[i].norm().item<double>(), rn = r.norm().item<double>();
      const double ratio = (excluded[i] || wn == 0 || rn == 0) ? 1.0 : wn / rn;
      w[i] = w[i] - lr * ratio * r;
    }
  }
};

LambOptions options_like(const LambReference& ref, double wd) {
  return LambOptions(ref.lr).betas({ref.b1, ref.b2}).eps(ref.eps).weight_decay(wd);
}

double run(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, LambReference& ref, int steps) {
  const auto before = detached_copies(params);
  for (int s = 0; s < steps; ++s) {
    const auto grads = make_grads(params, s);
    set_grads(params, grads);
    opt.step();
    ref.step(grads);
  }
  return update_diff(before, params, ref.w);
}

TEST(LambTest, OneAndThreeStepsMatchThePaper) {
  for (int steps : {1, 3}) {
    auto params = make_params(11);
    LambReference ref(params, 0.01, std::vector<bool>(params.size(), false));
    Lamb opt(params, options_like(ref, 0.01));
    const double diff = run(opt, params, ref, steps);
    EXPECT_LE(diff, 1e-6) << steps << " steps";
    RecordProperty("update_diff_" + std::to_string(steps), sci(diff));
  }
}

TEST(LambTest, NegativeControlRatioOneMissesThePaper) {
  auto params = make_params(11);
  LambReference ref(params, 0.01, std::vector<bool>(params.size(), false));
  Lamb opt(params, options_like(ref, 0.01).exclude(true));
  const double diff = run(opt, params, ref, 1);
  EXPECT_GT(diff, 0.5);
  RecordProperty("ratio_one_diff", sci(diff));
}

TEST(LambTest, ParamGroupsExcludeOneDimensionalTensorsWithoutDecay) {
  auto params = make_params(12);
  LambReference ref(params, 0.01, {false, true, false, true});
  ref.weight_decay = {0.01, 0.0, 0.01, 0.0};
  Lamb opt(lamb_param_groups(split_for_adaptation(params), options_like(ref, 0.01)), options_like(ref, 0.01));
  EXPECT_LE(run(opt, params, ref, 3), 1e-6);
}

TEST(LambTest, ExcludedGroupIsAdamW) {
  auto params = make_params(13);
  auto twins = detached_copies(params);
  for (auto& t : twins) t.requires_grad_();
  const double wd = 0.05;
  Lamb lamb(params, LambOptions(0.01).eps(1e-8).weight_decay(wd).exclude(true));
  torch::optim::AdamW adamw(twins, torch::optim::AdamWOptions(0.01).eps(1e-8).weight_decay(wd));
  const auto before = detached_copies(params);
  for (int s = 0; s < 3; ++s) {
    const auto grads = make_grads(params, s);
    set_grads(params, grads);
    set_grads(twins, grads);
    lamb.step();
    adamw.step();
  }
  EXPECT_LE(update_diff(before, params, detached_copies(twins)), 1e-6);
}

TEST(LambTest, ZeroNormsUseRatioOneAndPhiClamps) {
  // A zero weight moves by lr * r; at step 1 r = g / (|g| + eps) (m_hat = g,
  // v_hat = g^2) plus wd * 0.
  auto w0 = at::zeros({3}, at::TensorOptions().dtype(at::kDouble)).requires_grad_();
  const at::Tensor g0 = at::tensor({0.5, -1.0, 2.0}, at::kDouble);
  const double lr = 0.1, eps = 1e-6;
  Lamb opt(std::vector<at::Tensor>{w0}, LambOptions(lr).eps(eps).weight_decay(0.1));
  w0.mutable_grad() = g0.clone();
  opt.step();
  EXPECT_TRUE(at::allclose(w0.detach(), -lr * g0 / (g0.abs() + eps), 0, 1e-15));

  // phi clamps ||w|| from above: with max_weight_norm = 0.5 the ratio is 0.5 / ||r||.
  auto w1 = at::full({4}, 3.0, at::TensorOptions().dtype(at::kDouble)).requires_grad_();
  const at::Tensor g1 = at::tensor({1.0, -2.0, 0.5, 4.0}, at::kDouble);
  Lamb clamped(std::vector<at::Tensor>{w1}, LambOptions(lr).eps(eps).max_weight_norm(0.5));
  w1.mutable_grad() = g1.clone();
  clamped.step();
  const at::Tensor r = g1 / (g1.abs() + eps);
  const at::Tensor expected = at::full({4}, 3.0, at::kDouble) - lr * 0.5 / r.norm().item<double>() * r;
  EXPECT_TRUE(at::allclose(w1.detach(), expected, 0, 1e-14));
}

TEST(LambTest, StateUsesAdamFieldNames) {
  auto params = make_params(14, at::kFloat);
  Lamb opt(params, LambOptions(0.01));
  set_grads(params, make_grads(params, 0));
  opt.step();
  ASSERT_EQ(opt.state().size(), params.size());
  for (const auto& p : params) {
    const auto& state = *opt.state().at(paratrain::compat::optimizer_state_key(p));
    const auto& s = dynamic_cast<const torch::optim::AdamWParamState&>(state);
    EXPECT_EQ(s.step(), 1);
    EXPECT_EQ(s.exp_avg().sizes(), p.sizes());
    EXPECT_EQ(s.exp_avg_sq().sizes(), p.sizes());
    EXPECT_FALSE(s.max_exp_avg_sq().defined());
  }
  // Model-state accounting (ZeRO's memory figures) counts both moments.
  EXPECT_EQ(tensor_bytes(optimizer_state_tensors(opt)), 2 * tensor_bytes(params));
}

TEST(LambTest, SaveLoadContinuesIdentically) {
  auto params = make_params(15, at::kFloat);
  const LambOptions options = LambOptions(0.02).weight_decay(0.01).betas({0.8, 0.99});
  Lamb a(lamb_param_groups(split_for_adaptation(params), options), options);
  for (int s = 0; s < 2; ++s) {
    set_grads(params, make_grads(params, s));
    a.step();
  }
  std::stringstream archive;
  torch::save(a, archive);

  auto resumed = detached_copies(params);
  auto fresh = detached_copies(params);
  for (auto& t : resumed) t.requires_grad_();
  for (auto& t : fresh) t.requires_grad_();
  Lamb b(lamb_param_groups(split_for_adaptation(resumed), LambOptions(1.0)), LambOptions(1.0));
  Lamb c(lamb_param_groups(split_for_adaptation(fresh), options), options);
  torch::load(b, archive);
  for (std::size_t g = 0; g < 2; ++g)
    EXPECT_TRUE(static_cast<const LambOptions&>(b.param_groups()[g].options()) ==
                static_cast<const LambOptions&>(a.param_groups()[g].options()))
        << "group " << g;
  for (int s = 2; s < 4; ++s) {
    const auto grads = make_grads(params, s);
    set_grads(params, grads);
    set_grads(resumed, grads);
    set_grads(fresh, grads);
    a.step();
    b.step();
    c.step();
  }
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], resumed[i])) << "tensor " << i;
  // Same options but no loaded moments or step counts: a different run.
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) worst = std::max(worst, relative_diff(fresh[i], params[i]));
  EXPECT_GT(worst, 1e-3);
}

}  // namespace
}  // namespace paratrain::optim

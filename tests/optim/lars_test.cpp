// Lars against the paper's Algorithm 1 (arXiv 1708.03888) written out here
// with plain tensor ops, one and three steps; excluded groups against
// torch::optim::SGD; zero norms; save/load round trip; the 1-D exclusion rule.
//
// Tolerance: 1e-6 relative on the update (w_after - w_before), in float64:
// the optimizer and the reference do the same arithmetic in another order
// (the optimizer's norms accumulate squares, the reference calls norm()), so
// measured diffs are ~1e-15. Comparing updates rather than weights keeps the
// check sensitive: a wrong trust ratio changes the update by O(1) relative.
// Negative controls: a doubled eta, and the ratio forced to 1, miss the
// reference by more than 0.5.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sstream>

#include "paratrain/core/compat.h"
#include "paratrain/core/model_state.h"
#include "paratrain/optim/lars.h"
#include "tests/optim/optim_testing.h"

namespace paratrain::optim {
namespace {

using namespace testing;

// Algorithm 1 with momentum, per tensor: d = g + wd w; local_lr = eta ||w|| /
// (||g|| + wd ||w|| + eps) (1 if a norm is 0 or the tensor is excluded);
// v = m v + lr local_lr d; w = w - v.
struct LarsReference {
  double lr = 1.0, momentum = 0.9, eta = 0.02, eps = 1e-8;
  std::vector<double> weight_decay;  // per tensor
  std::vector<bool> excluded;        // per tensor
  std::vector<at::Tensor> w, v;

  LarsReference(const std::vector<at::Tensor>& params, double wd, std::vector<bool> excl)
      : weight_decay(params.size(), wd), excluded(std::move(excl)), w(detached_copies(params)) {
    for (const auto& p : w) v.push_back(at::zeros_like(p));
  }
  void step(const std::vector<at::Tensor>& grads) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      const at::Tensor& g = grads[i];
      const double wd = weight_decay[i];
      const double wn = w[i].norm().item<double>(), gn = g.norm().item<double>();
      const double local = (excluded[i] || wn == 0 || gn == 0) ? 1.0 : eta * wn / (gn + wd * wn + eps);
      v[i] = momentum * v[i] + lr * local * (g + wd * w[i]);
      w[i] = w[i] - v[i];
    }
  }
};

LarsOptions options_like(const LarsReference& ref, double wd) {
  return LarsOptions(ref.lr).momentum(ref.momentum).trust_coefficient(ref.eta).eps(ref.eps).weight_decay(wd);
}

// Runs `steps` steps of `opt` over `params` and of `ref`; returns the worst
// relative update diff.
double run(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, LarsReference& ref, int steps) {
  const auto before = detached_copies(params);
  for (int s = 0; s < steps; ++s) {
    const auto grads = make_grads(params, s);
    set_grads(params, grads);
    opt.step();
    ref.step(grads);
  }
  return update_diff(before, params, ref.w);
}

TEST(LarsTest, OneAndThreeStepsMatchThePaper) {
  for (int steps : {1, 3}) {
    auto params = make_params(1);
    LarsReference ref(params, 1e-2, std::vector<bool>(params.size(), false));
    Lars opt(params, options_like(ref, 1e-2));
    const double diff = run(opt, params, ref, steps);
    EXPECT_LE(diff, 1e-6) << steps << " steps";
    RecordProperty("update_diff_" + std::to_string(steps), sci(diff));
  }
}

TEST(LarsTest, NegativeControlWrongEtaOrNoRatioMissesThePaper) {
  {
    auto params = make_params(1);
    LarsReference ref(params, 1e-2, std::vector<bool>(params.size(), false));
    Lars opt(params, options_like(ref, 1e-2).trust_coefficient(2 * ref.eta));
    const double diff = run(opt, params, ref, 1);
    EXPECT_GT(diff, 0.5);
    RecordProperty("doubled_eta_diff", sci(diff));
  }
  {
    auto params = make_params(1);
    LarsReference ref(params, 1e-2, std::vector<bool>(params.size(), false));
    Lars opt(params, options_like(ref, 1e-2).exclude(true));  // trust ratio forced to 1
    const double diff = run(opt, params, ref, 1);
    EXPECT_GT(diff, 0.5);
    RecordProperty("ratio_one_diff", sci(diff));
  }
}

TEST(LarsTest, ParamGroupsExcludeOneDimensionalTensorsWithoutDecay) {
  auto params = make_params(2);
  const ParamSplit split = split_for_adaptation(params);
  ASSERT_EQ(split.adapted.size(), 2u);   // W1, W2
  ASSERT_EQ(split.excluded.size(), 2u);  // b1, b2
  LarsReference ref(params, 1e-2, {false, true, false, true});
  ref.weight_decay = {1e-2, 0.0, 1e-2, 0.0};
  Lars opt(lars_param_groups(split, options_like(ref, 1e-2)), options_like(ref, 1e-2));
  EXPECT_LE(run(opt, params, ref, 3), 1e-6);
}

TEST(LarsTest, ExcludedGroupIsMomentumSgd) {
  auto params = make_params(3);
  auto twins = detached_copies(params);
  for (auto& t : twins) t.requires_grad_();
  const double wd = 1e-2;
  Lars lars(params, LarsOptions(0.1).momentum(0.9).weight_decay(wd).exclude(true));
  torch::optim::SGD sgd(twins, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(wd));
  const auto before = detached_copies(params);
  for (int s = 0; s < 3; ++s) {
    const auto grads = make_grads(params, s);
    set_grads(params, grads);
    set_grads(twins, grads);
    lars.step();
    sgd.step();
  }
  EXPECT_LE(update_diff(before, params, detached_copies(twins)), 1e-6);

  // Not excluded, the same run is far from SGD: the check above can fail.
  auto adapted = make_params(3);
  Lars with_ratio(adapted, LarsOptions(0.1).momentum(0.9).weight_decay(wd));
  for (int s = 0; s < 3; ++s) {
    set_grads(adapted, make_grads(adapted, s));
    with_ratio.step();
  }
  EXPECT_GT(update_diff(before, adapted, detached_copies(twins)), 0.5);
}

TEST(LarsTest, ZeroNormsUseRatioOne) {
  // A zero weight (fresh zero-initialised tensor) and a zero gradient.
  auto w0 = at::zeros({3}, at::TensorOptions().dtype(at::kDouble)).requires_grad_();
  auto w1 = at::full({2, 2}, 2.0, at::TensorOptions().dtype(at::kDouble)).requires_grad_();
  const at::Tensor g0 = at::tensor({0.5, -1.0, 2.0}, at::kDouble);
  const double lr = 0.5, wd = 0.1;
  Lars opt(std::vector<at::Tensor>{w0, w1}, LarsOptions(lr).momentum(0.9).weight_decay(wd).trust_coefficient(1e-3));
  w0.mutable_grad() = g0.clone();
  w1.mutable_grad() = at::zeros({2, 2}, at::kDouble);
  opt.step();
  // local_lr = 1: w0 -= lr (g + wd * 0); w1 -= lr (0 + wd * 2).
  EXPECT_TRUE(at::allclose(w0.detach(), -lr * g0, 0, 1e-15));
  EXPECT_TRUE(at::allclose(w1.detach(), at::full({2, 2}, 2.0 - lr * wd * 2.0, at::kDouble), 0, 1e-15));
}

TEST(LarsTest, SaveLoadContinuesIdentically) {
  auto params = make_params(4, at::kFloat);
  Lars a(lars_param_groups(split_for_adaptation(params), LarsOptions(0.3).weight_decay(1e-3).trust_coefficient(0.01)),
         LarsOptions(0.3));
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
  const LarsOptions other = LarsOptions(9.0).trust_coefficient(0.5);
  Lars b(lars_param_groups(split_for_adaptation(resumed), other), other);
  Lars c(lars_param_groups(split_for_adaptation(fresh), other), other);
  torch::load(b, archive);
  for (std::size_t g = 0; g < 2; ++g)
    EXPECT_TRUE(static_cast<const LarsOptions&>(b.param_groups()[g].options()) ==
                static_cast<const LarsOptions&>(a.param_groups()[g].options()))
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
  // Without the loaded momentum and options the run diverges: the check can fail.
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) worst = std::max(worst, relative_diff(fresh[i], params[i]));
  EXPECT_GT(worst, 1e-3);
}

TEST(LarsTest, StateIsSgdsMomentumBuffer) {
  auto params = make_params(5, at::kFloat);
  Lars opt(params, LarsOptions(0.1));
  set_grads(params, make_grads(params, 0));
  opt.step();
  ASSERT_EQ(opt.state().size(), params.size());
  for (const auto& p : params) {
    const auto& state = *opt.state().at(paratrain::compat::optimizer_state_key(p));
    EXPECT_EQ(dynamic_cast<const torch::optim::SGDParamState&>(state).momentum_buffer().sizes(), p.sizes());
  }
  // Model-state accounting (ZeRO's memory figures) sees the buffers unchanged.
  EXPECT_EQ(tensor_bytes(optimizer_state_tensors(opt)), tensor_bytes(params));
}

TEST(LarsTest, SplitByNameKeepsModuleOrder) {
  torch::nn::Sequential model(torch::nn::Linear(3, 4), torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})),
                              torch::nn::Linear(4, 2));
  const ParamSplit split = split_for_adaptation(model->named_parameters());
  EXPECT_EQ(split.adapted_names, (std::vector<std::string>{"0.weight", "2.weight"}));
  EXPECT_EQ(split.excluded_names, (std::vector<std::string>{"0.bias", "1.weight", "1.bias", "2.bias"}));
  const auto groups = lars_param_groups(split, LarsOptions(0.1).weight_decay(5e-4));
  const auto& adapted = static_cast<const LarsOptions&>(groups[0].options());
  const auto& excluded = static_cast<const LarsOptions&>(groups[1].options());
  EXPECT_FALSE(adapted.exclude());
  EXPECT_EQ(adapted.weight_decay(), 5e-4);
  EXPECT_TRUE(excluded.exclude());
  EXPECT_EQ(excluded.weight_decay(), 0.0);
  EXPECT_EQ(static_cast<const LarsOptions&>(lars_param_groups(split, LarsOptions(0.1).weight_decay(5e-4), true)[1]
                                                .options())
                .weight_decay(),
            5e-4);
}

}  // namespace
}  // namespace paratrain::optim

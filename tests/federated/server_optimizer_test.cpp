// Server optimizers against Reddi et al.'s Algorithm 2 (arXiv 2003.00295)
// written out by hand for two steps on a 3-element vector. Each kind is
// also checked to differ from the others on step two (where their second
// moments part), so a dispatcher that ran one formula for all would fail.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>

#include "paratrain/core/error.h"
#include "paratrain/federated/server_optimizer.h"

namespace paratrain::federated {
namespace {

const std::vector<double> kX0{0.5, -1.0, 2.0};
const std::vector<double> kDelta1{0.1, -0.2, 0.05};
const std::vector<double> kDelta2{-0.3, 0.4, 0.05};

at::Tensor tensor(const std::vector<double>& v) { return torch::tensor(v, torch::kFloat); }

// The paper's update per coordinate, in double precision.
std::vector<double> reference(ServerOptimizerOptions o) {
  std::vector<double> x = kX0, m(3, 0.0), v(3, o.tau * o.tau);
  for (const auto* delta : {&kDelta1, &kDelta2}) {
    for (int i = 0; i < 3; ++i) {
      const double d = (*delta)[i], d2 = d * d;
      if (o.kind == ServerOptimizerKind::kSgd) {
        m[i] = o.momentum * m[i] + d;
        x[i] += o.lr * m[i];
        continue;
      }
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * d;
      if (o.kind == ServerOptimizerKind::kAdagrad) v[i] = v[i] + d2;
      if (o.kind == ServerOptimizerKind::kAdam) v[i] = o.beta2 * v[i] + (1 - o.beta2) * d2;
      if (o.kind == ServerOptimizerKind::kYogi) {
        const double s = v[i] - d2 > 0 ? 1.0 : (v[i] - d2 < 0 ? -1.0 : 0.0);
        v[i] = v[i] - (1 - o.beta2) * d2 * s;
      }
      x[i] += o.lr * m[i] / (std::sqrt(v[i]) + o.tau);
    }
  }
  return x;
}

at::Tensor run(ServerOptimizerOptions o) {
  ServerOptimizer opt(o);
  auto x = tensor(kX0);
  opt.step(x, tensor(kDelta1));
  opt.step(x, tensor(kDelta2));
  return x;
}

TEST(ServerOptimizer, MatchesTheAlgorithmForEveryKind) {
  for (auto kind : {ServerOptimizerKind::kSgd, ServerOptimizerKind::kAdagrad, ServerOptimizerKind::kYogi,
                    ServerOptimizerKind::kAdam}) {
    ServerOptimizerOptions o;
    o.kind = kind;
    o.lr = kind == ServerOptimizerKind::kSgd ? 0.7 : 0.03;
    o.momentum = 0.5;
    o.beta1 = 0.8;
    o.beta2 = 0.95;
    o.tau = 0.01;
    const auto got = run(o);
    const auto want = reference(o);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i].item<double>(), want[i], 1e-6) << "kind " << int(kind) << " i " << i;
  }
}

// The control: the four updates really differ (tau small enough that the
// adaptive denominators matter).
TEST(ServerOptimizer, KindsDiffer) {
  std::vector<at::Tensor> results;
  for (auto kind : {ServerOptimizerKind::kAdagrad, ServerOptimizerKind::kYogi, ServerOptimizerKind::kAdam}) {
    ServerOptimizerOptions o;
    o.kind = kind;
    o.lr = 0.03;
    o.beta2 = 0.5;  // far from 1: Yogi's additive and Adam's multiplicative v updates part visibly
    o.tau = 0.01;
    results.push_back(run(o));
  }
  EXPECT_GT((results[0] - results[1]).abs().max().item<double>(), 1e-4);
  EXPECT_GT((results[1] - results[2]).abs().max().item<double>(), 1e-4);
}

TEST(ServerOptimizer, SgdWithLrOneIsTheMeanModel) {
  ServerOptimizer opt(ServerOptimizerOptions{});
  auto x = tensor(kX0);
  opt.step(x, tensor(kDelta1));
  EXPECT_TRUE(torch::allclose(x, tensor(kX0) + tensor(kDelta1)));
  EXPECT_THROW(parse_server_optimizer("adamw"), ConfigError);
}

}  // namespace
}  // namespace paratrain::federated

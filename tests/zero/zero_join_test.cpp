// A rank whose loss reaches no parameter (an empty batch, a loss that is a
// constant) fires no gradient hook, so it issues none of the step's
// collectives while its peers wait in theirs. ZeroDataParallel::step()
// finishes its backward by joining them with zero gradients (Note [Joining]
// in docs/notes/ddp.md), as DDP does: the step completes on every rank and
// equals one process stepping on the average of the peers' gradients and
// this rank's zeros.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <vector>

#include "paratrain/data_parallel/zero/zero.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace {

torch::nn::Sequential make_net() {
  return paratrain::testing::seeded(7, [] {
    return torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::Tanh(), torch::nn::Linear(12, 3));
  });
}

torch::Tensor xs() { return torch::linspace(-1, 1, 8 * 6).reshape({8, 6}); }
torch::Tensor ys() { return torch::linspace(1, -1, 8 * 3).reshape({8, 3}); }

class ZeroJoin : public ::testing::TestWithParam<int> {};

TEST_P(ZeroJoin, ARankWhoseLossReachesNoParameterJoinsThePeersStep) {
  const int stage = GetParam();
  // One process: rank 0's gradient averaged with rank 1's zeros.
  auto ref = make_net();
  torch::nn::functional::mse_loss(ref->forward(xs()), ys()).backward();
  for (auto& p : ref->parameters()) p.mutable_grad().div_(2);
  torch::optim::SGD(ref->parameters(), torch::optim::SGDOptions(0.1)).step();

  std::vector<std::vector<at::Tensor>> got(2);
  paratrain::testing::run_ranks(
      2,
      [&](paratrain::comm::ProcessGroup& g) {
        auto net = make_net();
        paratrain::zero::ZeroOptions options;
        options.stage = stage;
        options.timeout = std::chrono::seconds(10);  // without the join, rank 0 waits this long and fails
        paratrain::zero::ZeroDataParallel zero(net.ptr(), g, options);
        torch::optim::SGD opt(zero.optimizer_params(), torch::optim::SGDOptions(0.1));
        zero.prepare_forward();
        const auto loss = g.rank() == 0 ? torch::nn::functional::mse_loss(net->forward(xs()), ys())
                                        : torch::zeros({}, torch::requires_grad());  // no parameter in its graph
        loss.backward();
        zero.step(opt);
        for (const auto& p : net->parameters()) got[g.rank()].push_back(p.detach().clone());
      },
      std::chrono::seconds(20));
  const auto want = ref->parameters();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[r][i], want[i], 1e-6, 1e-7)) << "stage " << stage << " rank " << r << " param " << i;
    }
  }
  // Control: the average is not rank 0's own gradient (the zeros counted).
  auto own = make_net();
  torch::nn::functional::mse_loss(own->forward(xs()), ys()).backward();
  torch::optim::SGD(own->parameters(), torch::optim::SGDOptions(0.1)).step();
  EXPECT_FALSE(torch::allclose(own->parameters()[0], want[0], 1e-6, 1e-7));
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroJoin, ::testing::Values(1, 2));

}  // namespace

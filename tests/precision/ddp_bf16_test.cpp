// DDP and dtype changes: a model converted to bf16 before wrapping trains
// with synchronized bf16 gradients (every rank holds the average of the
// per-rank gradients, computed here without DDP as the oracle); converting
// after wrapping is refused (the reducer's hooks and buckets were built for
// the old tensors and would silently stop synchronizing).
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>


#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain {
namespace {

torch::nn::Sequential make_net() {
  return paratrain::testing::seeded(9, [] {
    return torch::nn::Sequential(torch::nn::Linear(12, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  });
}

at::Tensor loss_of(torch::nn::Sequential& net, int rank, int step) {
  // A generator of its own: ranks are threads, the global one would race.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + 10 * rank + step);
  at::Tensor x = torch::randn({6, 12}, gen).to(at::kBFloat16);
  at::Tensor y = torch::randint(0, 3, {6}, gen, torch::kLong);
  return torch::nn::functional::cross_entropy(net->forward(x).to(at::kFloat), y);
}

// Debian's Gloo (LibTorch 1.13) has no bfloat16 kernels: the initial
// broadcast sends bf16 as fp16 words and the buckets are all-reduced as bytes
// with an fp32 sum (comm/low_precision_all_reduce.h).
TEST(DdpBf16, ConvertedBeforeWrappingKeepsGradientsSynchronized) {
  constexpr int kWorld = 2, kSteps = 3;
  // Oracle: each rank's bf16 gradients of the same weights, without DDP.
  std::vector<std::vector<std::vector<at::Tensor>>> local(kSteps, std::vector<std::vector<at::Tensor>>(kWorld));
  std::vector<std::vector<std::vector<at::Tensor>>> synced(kSteps, std::vector<std::vector<at::Tensor>>(kWorld));
  testing::run_ranks(kWorld, [&](comm::ProcessGroup& g) {
    auto net = make_net();
    net->to(at::kBFloat16);
    auto twin = make_net();  // same init, no DDP: the per-rank gradient
    twin->to(at::kBFloat16);
    ddp::DistributedDataParallel ddp(net.ptr(), g);
    torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 0; step < kSteps; ++step) {
      ddp.prepare_forward();
      opt.zero_grad();
      loss_of(net, g.rank(), step).backward();
      ddp.finish_backward();
      for (auto& p : twin->parameters()) p.mutable_grad() = at::Tensor();
      loss_of(twin, g.rank(), step).backward();
      for (size_t i = 0; i < net->parameters().size(); ++i) {
        EXPECT_EQ(net->parameters()[i].grad().scalar_type(), at::kBFloat16);
        synced[step][g.rank()].push_back(net->parameters()[i].grad().clone());
        local[step][g.rank()].push_back(twin->parameters()[i].grad().clone());
      }
      opt.step();
      torch::NoGradGuard no_grad;  // the twin follows the wrapped model
      for (size_t i = 0; i < net->parameters().size(); ++i) twin->parameters()[i].copy_(net->parameters()[i]);
    }
  });
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < synced[step][0].size(); ++i) {
      EXPECT_TRUE(torch::equal(synced[step][0][i], synced[step][1][i])) << "step " << step << " param " << i;
      const at::Tensor mean = (local[step][0][i].to(at::kFloat) + local[step][1][i].to(at::kFloat)) / 2;
      const double ref = std::max(mean.abs().max().item<double>(), 1e-6);
      // The pre-division by 2 is exact; the fp32 sum is rounded once to
      // bf16 (2^-8 relative).
      EXPECT_LT((synced[step][0][i].to(at::kFloat) - mean).abs().max().item<double>() / ref, 1e-2)
          << "step " << step << " param " << i;
      // Negative control: the two ranks' own gradients differ, so equality
      // above comes from the reduction.
      EXPECT_FALSE(torch::equal(local[step][0][i], local[step][1][i]));
    }
  }
}

TEST(DdpBf16, ConvertingAfterWrappingIsRefused) {
  testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    auto net = make_net();
    ddp::DistributedDataParallel ddp(net.ptr(), g);
    net->to(at::kBFloat16);
    EXPECT_THROW(ddp.prepare_forward(), Error);
  });
}

}  // namespace
}  // namespace paratrain

// FSDP's gradients go through the DDP reducer (Note [Gradients through the
// reducer], engine.cpp): no full-size .grad is alive when a unit's
// reduce-scatter starts, and find_unused_parameters behaves as in DDP (an
// error naming the parameter without it; with it the unused unit gets a zero
// gradient and the rest matches one process).
// Tolerance: 1e-5 relative, as in fsdp_oracle_test.cpp.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>
#include <vector>

#include "paratrain/core/error.h"
#include "tests/fsdp/fsdp_training.h"
#include "tests/support/forwarding_group.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::fsdp::testing {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 1234;

// At every reduce-scatter (a unit's bucket launching), sums the bytes of the
// model parameters' full .grad still alive.
class GradProbeGroup final : public paratrain::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  comm::WorkHandle reduce_scatter(at::Tensor& out, const at::Tensor& in, comm::ReduceOp op) override {
    int64_t bytes = 0;
    for (const at::Tensor& p : params) bytes += p.grad().defined() ? static_cast<int64_t>(p.grad().nbytes()) : 0;
    alive_bytes.push_back(bytes);
    return inner().reduce_scatter(out, in, op);
  }
  std::vector<at::Tensor> params;
  std::vector<int64_t> alive_bytes;
};

// Each .grad is released once it is in its unit's bucket, so when a unit's
// reduce-scatter starts no full gradient is alive, not even the units'
// already reduced earlier in backward nor this unit's own. (Kept until the end
// of backward, as the reducer does for DDP, the last launch would see every
// parameter's .grad.) Under no_sync, .grad must still accumulate.
TEST(FsdpReducer, NoFullGradientAliveWhenAUnitIsReduced) {
  paratrain::testing::run_ranks(2, [](comm::ProcessGroup& real) {
    GradProbeGroup group(real);
    auto model = ddp::testing::make_model(ModelKind::kMlp, kSeed);
    FsdpOptions o;
    o.unit_min_params = 0;  // fc0, fc1, fc2: three units, three buckets
    FullyShardedDataParallel fsdp(model, group, o);
    for (const auto& p : model->parameters()) group.params.push_back(p);
    auto input = torch::ones({2, 64});
    auto backward = [&] {
      fsdp.prepare_forward();
      dynamic_cast<models::Model&>(*model).forward(input).sum().backward();
    };
    backward();
    ASSERT_EQ(group.alive_bytes.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k) EXPECT_EQ(group.alive_bytes[k], 0) << "launch " << k;
    for (const at::Tensor& p : group.params) EXPECT_FALSE(p.grad().defined());
    for (const at::Tensor& piece : fsdp.optimizer_params()) EXPECT_TRUE(piece.grad().defined());
    // no_sync: the accumulated .grad stays (until its hook in the next
    // synchronized backward has put the sum in the bucket).
    {
      auto guard = fsdp.no_sync();
      backward();
    }
    EXPECT_EQ(group.alive_bytes.size(), 3u) << "no_sync launched a reduce-scatter";
    for (const at::Tensor& p : group.params) EXPECT_TRUE(p.grad().defined()) << "no_sync must keep .grad";
    backward();
    ASSERT_EQ(group.alive_bytes.size(), 6u);
    EXPECT_EQ(group.alive_bytes.back(), 0);
    for (const at::Tensor& p : group.params) EXPECT_FALSE(p.grad().defined());
  });
}

struct UnusedNet : torch::nn::Module {
  UnusedNet() {
    used = register_module("used", torch::nn::Linear(8, 4));
    unused = register_module("unused", torch::nn::Linear(8, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return used->forward(x); }
  torch::nn::Linear used{nullptr};
  torch::nn::Linear unused{nullptr};
};

at::Tensor loss_on(UnusedNet& net, const at::Tensor& x) { return net.forward(x).pow(2).mean(); }

TEST(FsdpReducer, UnusedParametersAsInDdp) {
  constexpr int kWorld = 2;
  constexpr double kLr = 0.1;
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({8, 8});
  torch::manual_seed(kSeed);
  UnusedNet oracle;
  std::vector<std::pair<std::string, at::Tensor>> initial;
  for (const auto& item : oracle.named_parameters()) initial.emplace_back(item.key(), item.value().detach().clone());
  loss_on(oracle, x).backward();
  std::vector<std::pair<std::string, at::Tensor>> want;
  for (const auto& item : oracle.named_parameters()) {
    const bool used = item.key().rfind("used.", 0) == 0;
    want.emplace_back(item.key(), used ? (item.value() - kLr * item.value().grad()).detach() : item.value().detach());
  }

  for (bool find_unused : {false, true}) {
    paratrain::testing::run_ranks(kWorld, [&](comm::ProcessGroup& group) {
      auto net = paratrain::testing::seeded(kSeed, [] { return std::make_shared<UnusedNet>(); });
      FsdpOptions o;
      o.unit_min_params = 0;
      o.find_unused_parameters = find_unused;
      FullyShardedDataParallel fsdp(net, group, o);
      torch::optim::SGD opt(fsdp.optimizer_params(), torch::optim::SGDOptions(kLr));
      fsdp.prepare_forward();
      const at::Tensor local = x.narrow(0, group.rank() * 4, 4);
      if (!find_unused) {
        try {
          loss_on(*net, local).backward();
          ADD_FAILURE() << "backward with an unused parameter did not throw";
        } catch (const Error& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("'unused.weight'"), std::string::npos) << msg;
          EXPECT_NE(msg.find("FsdpOptions"), std::string::npos) << msg;
        }
        return;
      }
      loss_on(*net, local).backward();
      fsdp.step(opt);
      const auto got = fsdp.full_parameters();
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].first, want[i].first);
        const at::Tensor& w = want[i].second;
        const double diff = (got[i].second - w).abs().max().item<double>() / w.abs().max().item<double>();
        EXPECT_LE(diff, kTolerance) << got[i].first << " rank " << group.rank();
      }
      // Control: the used parameters did move (the step was not a no-op).
      EXPECT_FALSE(torch::allclose(got[0].second, initial[0].second)) << got[0].first;
    });
  }
}

}  // namespace
}  // namespace paratrain::fsdp::testing

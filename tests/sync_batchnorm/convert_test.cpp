// convert_sync_batchnorm: every BatchNorm in Sequential/ModuleList/ModuleDict
// containers (nested) becomes a SyncBatchNorm under the same name with the
// same values, and the converted model trained on 2 ranks computes what the
// original computes on the concatenated batch (1e-5 relative, as
// sync_batchnorm_test.cpp). A BatchNorm held by a plain module's member is
// refused unless allowed (its forward would bypass the replacement).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <mutex>

#include "paratrain/data_parallel/sync_batchnorm/convert_sync_batchnorm.h"
#include "paratrain/data_parallel/sync_batchnorm/sync_batchnorm.h"
#include "tests/support/multi_rank.h"

namespace paratrain::sync_batchnorm {
namespace {

constexpr double kTolerance = 1e-5;

// conv -> BatchNorm2d -> relu -> flatten -> [ModuleList: linear, BatchNorm1d]
struct ListStage : torch::nn::Module {
  torch::nn::ModuleList list;
  explicit ListStage(torch::nn::ModuleList l) : list(register_module("list", std::move(l))) {}
  at::Tensor forward(at::Tensor x) {
    for (const auto& m : *list) {
      if (auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m)) {
        x = lin->forward(x);
      } else if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(m)) {
        x = bn->forward(x);
      } else {
        x = std::dynamic_pointer_cast<SyncBatchNormImpl>(m)->forward(x);
      }
    }
    return x;
  }
};

// A Sequential nested in a Sequential needs a non-template forward. (Not
// cloneable as a Block: tests build fresh models instead of cloning.)
struct Block : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  at::Tensor forward(at::Tensor x) { return SequentialImpl::forward(x); }
};

torch::nn::Sequential make_model() {
  torch::manual_seed(5);
  auto inner = std::make_shared<Block>(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)), torch::nn::BatchNorm2d(3),
                                       torch::nn::ReLU());
  torch::nn::Sequential model(inner, torch::nn::Flatten(),
                              std::make_shared<ListStage>(torch::nn::ModuleList(torch::nn::Linear(3 * 4 * 4, 5), torch::nn::BatchNorm1d(5))));
  // Non-default statistics and affine values, so copying them is visible.
  model->train();
  model->forward(torch::randn({6, 2, 6, 6}) + 1);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.1);
  return model;
}

TEST(ConvertSyncBatchNorm, KeepsNamesAndValues) {
  testing::run_ranks(1, [](comm::ProcessGroup& group) {
    torch::nn::Sequential original = make_model();
    auto converted_module = convert_sync_batchnorm(make_model().ptr(), group);
    auto& converted = *converted_module;
    int syncs = 0;
    for (const auto& m : converted.modules()) syncs += std::dynamic_pointer_cast<SyncBatchNormImpl>(m) != nullptr;
    EXPECT_EQ(syncs, 2);
    for (const auto& m : converted.modules()) {
      EXPECT_FALSE(std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(m));
      EXPECT_FALSE(std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(m));
    }
    const auto want_p = original->named_parameters();
    const auto got_p = converted.named_parameters();
    ASSERT_EQ(got_p.keys(), want_p.keys());
    for (const auto& item : want_p) {
      EXPECT_TRUE(torch::equal(got_p[item.key()], item.value())) << item.key();
      EXPECT_EQ(got_p[item.key()].requires_grad(), item.value().requires_grad()) << item.key();
    }
    const auto want_b = original->named_buffers();
    const auto got_b = converted.named_buffers();
    ASSERT_EQ(got_b.keys(), want_b.keys());
    for (const auto& item : want_b) EXPECT_TRUE(torch::equal(got_b[item.key()], item.value())) << item.key();
    EXPECT_TRUE(want_b.contains("0.1.running_var"));
    EXPECT_EQ(want_b["0.1.num_batches_tracked"].item<int64_t>(), 1);
  });
}

// The converted model on 2 ranks (batches of 2 and 4) equals the original on
// the concatenated batch of 6: output and input gradient.
TEST(ConvertSyncBatchNorm, ConvertedModelMatchesOriginalOnConcatenatedBatch) {
  // make_model() is deterministic; built here, not in the rank threads (the
  // global generator is not for concurrent use) and not cloned (the
  // containers' subclasses would not survive clone()).
  torch::nn::Sequential oracle = make_model();
  std::vector<torch::nn::Sequential> replicas = {make_model(), make_model()};
  torch::manual_seed(9);
  const at::Tensor x = torch::randn({6, 2, 6, 6}) * 2 + 0.5;
  const at::Tensor r = torch::randn({6, 5});
  at::Tensor xo = x.clone().requires_grad_(true);
  at::Tensor yo = oracle->forward(xo);
  (yo * r).sum().backward();

  const std::vector<int64_t> sizes = {2, 4};
  std::vector<at::Tensor> ys(2), dxs(2);
  std::mutex mu;
  testing::run_ranks(2, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
        convert_sync_batchnorm(replicas[rank].ptr(), group));
    ASSERT_TRUE(model);
    const int64_t begin = rank == 0 ? 0 : sizes[0];
    at::Tensor xr = x.narrow(0, begin, sizes[rank]).clone().requires_grad_(true);
    at::Tensor y = model->forward(xr);
    (y * r.narrow(0, begin, sizes[rank])).sum().backward();
    std::lock_guard lock(mu);
    ys[rank] = y.detach();
    dxs[rank] = xr.grad();
  });
  auto rel = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  EXPECT_LE(rel(torch::cat(ys), yo.detach()), kTolerance);
  EXPECT_LE(rel(torch::cat(dxs), xo.grad()), kTolerance);
}

struct PlainParent : torch::nn::Module {
  torch::nn::BatchNorm1d bn{nullptr};
  PlainParent() { bn = register_module("bn", torch::nn::BatchNorm1d(3)); }
};

TEST(ConvertSyncBatchNorm, PlainParentNeedsOptIn) {
  testing::run_ranks(1, [](comm::ProcessGroup& group) {
    auto parent = std::make_shared<PlainParent>();
    EXPECT_THROW(convert_sync_batchnorm(parent, group), c10::Error);
    convert_sync_batchnorm(parent, group, {.allow_plain_parents = true});
    EXPECT_TRUE(std::dynamic_pointer_cast<SyncBatchNormImpl>(parent->named_children()["bn"]));
    // A bare BatchNorm is returned converted.
    auto bare = convert_sync_batchnorm(torch::nn::BatchNorm2d(3).ptr(), group);
    EXPECT_TRUE(std::dynamic_pointer_cast<SyncBatchNormImpl>(bare));
  });
}

}  // namespace
}  // namespace paratrain::sync_batchnorm

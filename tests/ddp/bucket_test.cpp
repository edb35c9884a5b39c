// The run-time bucket (state machine, slots aliasing the buffer) and the
// overlap arithmetic of StepStats; no communication involved.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/bucket.h"
#include "paratrain/data_parallel/ddp/step_stats.h"

namespace paratrain::ddp {
namespace {

// A collective that is already done.
class DoneWork final : public comm::Work {
 public:
  void wait(std::chrono::milliseconds) override { ++waits; }
  bool is_completed() override { return true; }
  int waits = 0;
};

struct TwoParams {
  std::vector<at::Tensor> params{torch::zeros({2, 3}), torch::zeros({4})};
  // Reverse order, as plan_buckets would lay them out.
  BucketPlan plan{at::kFloat, at::kCPU, {1, 0}, {0, 4}, 10, 12};
};

void expect_error_containing(const std::function<void()>& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error containing '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Bucket, FullCycleThroughAllStates) {
  TwoParams tp;
  Bucket b(0, tp.plan, tp.params);
  EXPECT_EQ(b.state(), BucketState::kFilling);
  EXPECT_FALSE(b.fill(0));
  EXPECT_TRUE(b.fill(1));  // the last slot
  b.mark_ready();
  EXPECT_EQ(b.state(), BucketState::kReady);
  auto work = std::make_shared<DoneWork>();
  b.launch(work);
  EXPECT_EQ(b.state(), BucketState::kLaunched);
  EXPECT_TRUE(b.work_completed());
  b.wait(std::chrono::seconds(1));
  EXPECT_EQ(work->waits, 1);
  EXPECT_EQ(b.state(), BucketState::kReduced);
  b.reset();
  EXPECT_EQ(b.state(), BucketState::kFilling);
  EXPECT_FALSE(b.filled(0));
  EXPECT_FALSE(b.fill(0));  // a new step starts from scratch
}

TEST(Bucket, IllegalTransitionsAreErrors) {
  TwoParams tp;
  Bucket b(3, tp.plan, tp.params);
  expect_error_containing([&] { b.wait(std::chrono::seconds(1)); }, "cannot wait while filling");
  expect_error_containing([&] { b.launch(std::make_shared<DoneWork>()); }, "cannot launch while filling");
  expect_error_containing([&] { b.mark_ready(); }, "2 of 2 gradients missing");
  b.fill(0);
  expect_error_containing([&] { b.fill(0); }, "slot 0 filled twice");
  b.fill(1);
  b.mark_ready();
  expect_error_containing([&] { b.wait(std::chrono::seconds(1)); }, "cannot wait while ready");
  b.launch(std::make_shared<DoneWork>());
  expect_error_containing([&] { b.reset(); }, "cannot reset while launched");
  expect_error_containing([&] { b.fill(0); }, "cannot fill a slot while launched");
}

TEST(Bucket, SlotsAliasTheBufferWithoutBeingAutogradViews) {
  TwoParams tp;
  Bucket b(0, tp.plan, tp.params);
  EXPECT_EQ(b.buffer().numel(), 12);  // padded
  const at::Tensor& s0 = b.slot(0);   // param 1, shape [4], offset 0
  const at::Tensor& s1 = b.slot(1);   // param 0, shape [2, 3], offset 4
  EXPECT_EQ(s0.sizes(), tp.params[1].sizes());
  EXPECT_EQ(s1.sizes(), tp.params[0].sizes());
  s1.fill_(2.0);
  EXPECT_EQ(b.buffer().slice(0, 4, 10).sum().item<float>(), 12.0f);
  EXPECT_EQ(b.buffer().sum().item<float>(), 12.0f);  // nothing outside the slot
  EXPECT_FALSE(s1.is_view());
  // A slot works as .grad under LibTorch's optimizer (zero_grad detach_()es
  // every grad, which throws for autograd views).
  at::Tensor p = torch::ones({2, 3}, torch::requires_grad());
  p.mutable_grad() = s1;
  torch::optim::SGD opt({p}, 0.1);
  EXPECT_NO_THROW(opt.zero_grad());
  EXPECT_EQ(b.buffer().abs().sum().item<float>(), 0.0f);
}

TEST(Bucket, AbandonKeepsInFlightBufferAndStartsClean) {
  TwoParams tp;
  Bucket b(0, tp.plan, tp.params);
  b.fill(0);
  b.fill(1);
  b.mark_ready();
  const void* old = b.buffer().data_ptr();
  b.launch(std::make_shared<DoneWork>());
  b.abandon();
  EXPECT_EQ(b.state(), BucketState::kFilling);
  EXPECT_NE(b.buffer().data_ptr(), old);
  EXPECT_EQ(b.slot(0).data_ptr(), b.buffer().data_ptr());
}

TEST(StepStats, HiddenShareIsTheInFlightTimeBeforeBackwardEnded) {
  StepStats s;
  s.backward_ms = 10;
  // In flight [2, 6] and [5, 14]: union [2, 14] = 12 ms, of which [2, 10] = 8 ms hidden.
  s.buckets = {{100, 1, 2, 6}, {100, 4, 5, 14}};
  EXPECT_DOUBLE_EQ(s.comm_ms(), 12);
  EXPECT_DOUBLE_EQ(s.hidden_ms(), 8);
  EXPECT_DOUBLE_EQ(s.hidden_share(), 8.0 / 12.0);
  StepStats none;
  EXPECT_EQ(none.hidden_share(), 0);
  // All communication after backward: nothing hidden.
  StepStats late;
  late.backward_ms = 3;
  late.buckets = {{100, 3, 3, 9}};
  EXPECT_DOUBLE_EQ(late.hidden_share(), 0);
}

}  // namespace
}  // namespace paratrain::ddp

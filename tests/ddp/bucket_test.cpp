// The run-time bucket (state machine, transient buffers, slots aliasing the
// buffer via alias_of) and the overlap arithmetic of StepStats; no communication.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/core/tensor_alias.h"
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

// alias_of() (core/tensor_alias.h), which makes the slots: offsets count
// from the base's own storage offset, the range must fit the storage, and
// the result is an ordinary tensor that can become a leaf requiring grad
// (ZeRO's optimizer pieces). Lives here until tests/core has a home for it.
TEST(AliasOf, SharesStorageAtTheBasesOffsetWithoutBeingAView) {
  at::Tensor flat = torch::arange(10, torch::kFloat);
  at::Tensor base = alias_of(flat, 2, {8});  // elements 2..9
  at::Tensor a = alias_of(base, 3, {2, 2});  // elements 5..8
  EXPECT_TRUE(torch::equal(a, torch::tensor({{5.f, 6.f}, {7.f, 8.f}})));
  EXPECT_FALSE(a.is_view());
  a.fill_(-1);
  EXPECT_EQ(flat[6].item<float>(), -1.0f);
  EXPECT_NO_THROW(a.set_requires_grad(true));
  EXPECT_TRUE(a.is_leaf());
  EXPECT_THROW(alias_of(base, 5, {4}), c10::Error);  // elements 7..10: past the end
  EXPECT_THROW(alias_of(flat, -1, {1}), c10::Error);
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

// A transient bucket (ZeRO-2 / FSDP sinks) holds no buffer outside a step:
// acquire() in kFilling makes it (padding zero), release() in kReduced drops
// it and with it the memory (the slots' aliases go too), reset() drops it on
// any abort. Control: a persistent bucket keeps the same buffer throughout.
TEST(Bucket, TransientBufferLivesFromAcquireToRelease) {
  TwoParams tp;
  Bucket persistent(0, tp.plan, tp.params);
  EXPECT_EQ(persistent.held_bytes(), 48);
  persistent.release();  // a no-op: DDP keeps its buffer
  EXPECT_EQ(persistent.held_bytes(), 48);

  Bucket b(1, tp.plan, tp.params, {.transient_buffer = true});
  EXPECT_TRUE(b.transient());
  EXPECT_FALSE(b.has_buffer());
  EXPECT_EQ(b.held_bytes(), 0);
  EXPECT_EQ(b.bytes(), 48);  // what the collective will move
  EXPECT_EQ(b.slot_numel(1), 6);
  expect_error_containing([&] { b.slot(0); }, "transient buffer is not allocated");
  expect_error_containing([&] { b.buffer(); }, "transient buffer is not allocated");

  b.acquire();
  ASSERT_TRUE(b.has_buffer());
  EXPECT_EQ(b.held_bytes(), 48);
  EXPECT_EQ(b.buffer().slice(0, 10, 12).abs().sum().item<float>(), 0.0f) << "padding must be zero";
  const void* first = b.buffer().data_ptr();
  b.acquire();  // idempotent within a step
  EXPECT_EQ(b.buffer().data_ptr(), first);
  b.slot(0).fill_(1.0);
  b.slot(1).fill_(2.0);
  EXPECT_EQ(b.buffer().sum().item<float>(), 16.0f);
  b.fill(0);
  b.fill(1);
  b.mark_ready();
  b.launch(std::make_shared<DoneWork>());
  expect_error_containing([&] { b.release(); }, "cannot release its buffer while launched");
  b.wait(std::chrono::seconds(1));
  const c10::weak_intrusive_ptr<c10::StorageImpl> storage = b.buffer().storage().getWeakStorageImpl();
  b.release();
  EXPECT_FALSE(b.has_buffer());
  EXPECT_EQ(b.held_bytes(), 0);
  EXPECT_TRUE(storage.expired()) << "release() must free the memory, slots included";
  expect_error_containing([&] { b.acquire(); }, "cannot allocate its buffer while reduced");
  b.reset();
  EXPECT_EQ(b.state(), BucketState::kFilling);

  // An aborted step: reset() from kFilling drops a buffer acquired for it.
  b.acquire();
  b.fill(0);
  b.reset();
  EXPECT_FALSE(b.has_buffer());
}

// abandon() on a transient bucket keeps the in-flight buffer alive (the
// backend may still write it) and leaves the bucket without one.
TEST(Bucket, AbandonedTransientBufferStaysAliveButIsNotHeld) {
  TwoParams tp;
  Bucket b(0, tp.plan, tp.params, {.transient_buffer = true});
  b.acquire();
  b.fill(0);
  b.fill(1);
  b.mark_ready();
  const c10::weak_intrusive_ptr<c10::StorageImpl> storage = b.buffer().storage().getWeakStorageImpl();
  b.launch(std::make_shared<DoneWork>());
  b.abandon();
  EXPECT_EQ(b.state(), BucketState::kFilling);
  EXPECT_FALSE(b.has_buffer());
  EXPECT_FALSE(storage.expired()) << "the collective may still write the abandoned buffer";
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

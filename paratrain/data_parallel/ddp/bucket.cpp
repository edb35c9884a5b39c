// Bucket: see bucket.h.
#include "paratrain/data_parallel/ddp/bucket.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

// A tensor over `flat`'s storage at `offset` with `shape`, contiguous. Made
// with set_() rather than narrow()/view(): autograd treats those as views, and
// LibTorch's Optimizer::zero_grad() calls detach_() on every .grad, which
// throws for views. See Note [Gradients as bucket views].
at::Tensor alias_into(const at::Tensor& flat, int64_t offset, const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
  torch::NoGradGuard no_grad;
  at::Tensor t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
  return t;
}

}  // namespace

std::string_view to_string(BucketState state) {
  switch (state) {
    case BucketState::kFilling: return "filling";
    case BucketState::kReady: return "ready";
    case BucketState::kLaunched: return "launched";
    case BucketState::kReduced: return "reduced";
  }
  return "?";
}

Bucket::Bucket(std::size_t index, BucketPlan plan, const std::vector<at::Tensor>& params)
    : index_(index), plan_(std::move(plan)) {
  if (plan_.params.size() != plan_.offsets.size() || plan_.params.empty()) {
    throw Error(fmt::format("bucket {}: malformed plan ({} parameters, {} offsets)", index_,
                            plan_.params.size(), plan_.offsets.size()));
  }
  for (std::size_t p : plan_.params) {
    const at::Tensor& t = params.at(p);
    shapes_.emplace_back(t.sizes().begin(), t.sizes().end());
  }
  filled_.assign(plan_.params.size(), false);
  pending_ = plan_.params.size();
  make_buffer();
}

void Bucket::make_buffer() {
  buffer_ = at::zeros({plan_.padded_numel}, at::TensorOptions().dtype(plan_.dtype).device(plan_.device));
  slots_.clear();
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    slots_.push_back(alias_into(buffer_, plan_.offsets[i], shapes_[i]));
  }
}

int64_t Bucket::bytes() const {
  return plan_.padded_numel * static_cast<int64_t>(c10::elementSize(plan_.dtype));
}

void Bucket::expect(BucketState expected, std::string_view action) const {
  if (state_ != expected) {
    throw Error(fmt::format("bucket {}: cannot {} while {} (must be {}); this is a bug in the "
                            "reducer's step logic",
                            index_, action, to_string(state_), to_string(expected)));
  }
}

bool Bucket::fill(std::size_t i) {
  expect(BucketState::kFilling, "fill a slot");
  if (filled_.at(i)) {
    throw Error(fmt::format("bucket {}: slot {} filled twice in one step", index_, i));
  }
  filled_[i] = true;
  return --pending_ == 0;
}

void Bucket::mark_ready() {
  expect(BucketState::kFilling, "mark ready");
  if (pending_ != 0) {
    throw Error(fmt::format("bucket {}: marked ready with {} of {} gradients missing", index_,
                            pending_, filled_.size()));
  }
  state_ = BucketState::kReady;
}

void Bucket::launch(comm::WorkHandle work) {
  expect(BucketState::kReady, "launch");
  if (!work) throw Error(fmt::format("bucket {}: the communication hook returned no work", index_));
  work_ = std::move(work);
  state_ = BucketState::kLaunched;
}

bool Bucket::work_completed() const {
  expect(BucketState::kLaunched, "poll its collective");
  return work_->is_completed();
}

void Bucket::wait(std::chrono::milliseconds timeout) {
  expect(BucketState::kLaunched, "wait");
  work_->wait(timeout);
  work_.reset();
  state_ = BucketState::kReduced;
}

void Bucket::reset() {
  if (state_ == BucketState::kLaunched) expect(BucketState::kReduced, "reset");
  filled_.assign(filled_.size(), false);
  pending_ = filled_.size();
  state_ = BucketState::kFilling;
}

void Bucket::abandon() {
  if (state_ == BucketState::kLaunched) {
    abandoned_.emplace_back(buffer_, std::move(work_));
    work_.reset();
    make_buffer();
    state_ = BucketState::kReduced;  // nothing in flight on the new buffer
  }
  reset();
}

}  // namespace paratrain::ddp

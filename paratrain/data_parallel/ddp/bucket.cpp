// Bucket: see bucket.h.
#include "paratrain/data_parallel/ddp/bucket.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/tensor_alias.h"

namespace paratrain::ddp {
std::string_view to_string(BucketState state) {
  switch (state) {
    case BucketState::kFilling: return "filling";
    case BucketState::kReady: return "ready";
    case BucketState::kLaunched: return "launched";
    case BucketState::kReduced: return "reduced";
  }
  return "?";
}

Bucket::Bucket(std::size_t index, BucketPlan plan, const std::vector<at::Tensor>& params, BucketOptions options)
    : index_(index), plan_(std::move(plan)), options_(options) {
  if (plan_.params.size() != plan_.offsets.size() || plan_.params.empty()) {
    throw Error(fmt::format("bucket {}: malformed plan ({} parameters, {} offsets)", index_,
                            plan_.params.size(), plan_.offsets.size()));
  }
  for (std::size_t p : plan_.params) {
    const at::Tensor& t = params.at(p);
    shapes_.emplace_back(t.sizes().begin(), t.sizes().end());
    numels_.push_back(t.numel());
  }
  filled_.assign(plan_.params.size(), false);
  pending_ = plan_.params.size();
  if (!options_.transient_buffer) make_buffer(/*first=*/true);
}

// Persistent buffers start zeroed once. A transient buffer is made every
// step, and the reducer writes every slot in full before launch (a missing
// gradient is written as zero), so only the padding after the last slot
// needs zeroing: slots are back to back from offset 0 (validate_plans()).
void Bucket::make_buffer(bool first) {
  const auto opts = at::TensorOptions().dtype(plan_.dtype).device(plan_.device);
  if (options_.transient_buffer) {
    buffer_ = at::empty({plan_.padded_numel}, opts);
    buffer_.narrow(0, plan_.numel, plan_.padded_numel - plan_.numel).zero_();
  } else {
    if (first && options_.allocate && plan_.device.is_cpu())
      buffer_ = options_.allocate(plan_.padded_numel, plan_.dtype);
    if (!buffer_.defined() || !first) buffer_ = at::zeros({plan_.padded_numel}, opts);
  }
  slots_.clear();
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    slots_.push_back(alias_of(buffer_, plan_.offsets[i], shapes_[i]));
  }
}

void Bucket::missing_buffer(std::string_view action) const {
  throw Error(fmt::format("bucket {}: cannot {}: its transient buffer is not allocated (acquire() it in "
                          "kFilling); this is a bug in the reducer's step logic",
                          index_, action));
}

at::Tensor& Bucket::buffer() {
  if (!buffer_.defined()) missing_buffer("use the buffer");
  return buffer_;
}

const at::Tensor& Bucket::slot(std::size_t i) const {
  if (!buffer_.defined()) missing_buffer("use a slot");
  return slots_.at(i);
}

void Bucket::acquire() {
  if (buffer_.defined()) return;
  expect(BucketState::kFilling, "allocate its buffer");
  make_buffer();
}

void Bucket::release() {
  if (!options_.transient_buffer) return;
  expect(BucketState::kReduced, "release its buffer");
  drop_buffer();
}

// The slots go too: each alias holds the storage alive.
void Bucket::drop_buffer() {
  buffer_ = at::Tensor();
  slots_.clear();
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
  completed_at_ = work_->completed_at();
  work_.reset();
  state_ = BucketState::kReduced;
}

std::optional<comm::Work::Clock::time_point> Bucket::completed_at() const {
  if (state_ == BucketState::kLaunched) return work_->completed_at();
  return completed_at_;
}

void Bucket::reset() {
  if (state_ == BucketState::kLaunched) expect(BucketState::kReduced, "reset");
  filled_.assign(filled_.size(), false);
  pending_ = filled_.size();
  completed_at_.reset();
  state_ = BucketState::kFilling;
  if (options_.transient_buffer) drop_buffer();
}

void Bucket::abandon() {
  if (state_ == BucketState::kLaunched) {
    abandoned_.emplace_back(buffer_, std::move(work_));
    work_.reset();
    if (options_.transient_buffer) {
      drop_buffer();
    } else {
      make_buffer();
    }
    state_ = BucketState::kReduced;  // nothing in flight on the new buffer
  }
  reset();
}

}  // namespace paratrain::ddp

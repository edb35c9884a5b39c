// TwoPhaseWork (two_phase_work.h).
#include "paratrain/comm/two_phase_work.h"

namespace paratrain::comm {

void TwoPhaseWork::begin(WorkHandle first, WorkHandle also) {
  stage_ = std::move(first);
  also_ = std::move(also);
}

void TwoPhaseWork::advance_first() {
  stage_ = after_first();
  if (stage_) {
    phase_ = Phase::kSecond;
  } else {
    done();
  }
}

void TwoPhaseWork::done() {
  phase_ = Phase::kDone;
  done_at_ = Clock::now();
  stage_.reset();
  also_.reset();
}

void TwoPhaseWork::wait(std::chrono::milliseconds timeout) {
  std::lock_guard lock(mutex_);
  if (phase_ == Phase::kFirst) {
    stage_->wait(timeout);
    advance_first();
  }
  if (phase_ == Phase::kSecond) {
    stage_->wait(timeout);
    if (also_) also_->wait(timeout);
    after_second();
    done();
  }
}

bool TwoPhaseWork::is_completed() {
  std::lock_guard lock(mutex_);
  if (phase_ == Phase::kFirst && stage_->is_completed()) {
    stage_->wait(std::chrono::milliseconds(0));
    advance_first();
  }
  if (phase_ == Phase::kSecond && stage_->is_completed() && (!also_ || also_->is_completed())) {
    stage_->wait(std::chrono::milliseconds(0));
    if (also_) also_->wait(std::chrono::milliseconds(0));
    after_second();
    done();
  }
  return phase_ == Phase::kDone;
}

std::optional<Work::Clock::time_point> TwoPhaseWork::completed_at() {
  std::lock_guard lock(mutex_);
  return done_at_;
}

}  // namespace paratrain::comm

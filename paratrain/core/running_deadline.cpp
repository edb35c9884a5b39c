// RunningDeadline: see running_deadline.h.
#include "paratrain/core/running_deadline.h"

#include <algorithm>

namespace paratrain {

RunningDeadline::RunningDeadline(std::chrono::milliseconds timeout, Clock::time_point start)
    : timeout_(timeout), at_(start + timeout), last_look_(start) {}

bool RunningDeadline::passed(Clock::time_point now) {
  if (now - last_look_ > kPause) {
    const auto gap = now - last_look_;
    at_ += gap;
    stopped_ += gap;
  }
  last_look_ = std::max(last_look_, now);
  return now >= at_;
}

RunningDeadline::Clock::time_point RunningDeadline::next_look(Clock::time_point now) const {
  return std::min(at_, now + kSlice);
}

std::chrono::milliseconds RunningDeadline::left(Clock::time_point now) const {
  if (now >= at_) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(at_ - now);
}

std::chrono::milliseconds RunningDeadline::stopped() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(stopped_);
}

}  // namespace paratrain

// GlooWork: see gloo_work.h. Every Work of a group shares the group's mutex
// and condition variable, so abort() wakes all waiters with one notify.
#include "paratrain/comm/gloo/gloo_work.h"

#include <algorithm>

#include <ATen/core/ivalue.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::comm::gloo_detail {

GlooWork::GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> finish,
                   std::shared_ptr<GroupSignal> signal, std::chrono::milliseconds default_timeout, bool has_future)
    : work_(std::move(work)), what_(std::move(what)), finish_(std::move(finish)),
      signal_(std::move(signal)), default_timeout_(default_timeout) {
  if (!work_) {
    backend_->done = true;
    backend_->at = Clock::now();
    return;
  }
  if (!has_future) return;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work_->getFuture();
  } catch (...) {
    // c10d 1.13's SendWork/RecvWork have no future; wait() waits in c10d.
  }
  if (!future) return;
  has_future_ = true;
  // Runs on the Gloo worker thread the moment the operation ends (or at once
  // if it already has). Holds the shared state, not `this`: a Work dropped
  // without wait() must not be touched afterwards.
  future->addCallback([backend = backend_, signal = signal_](c10::ivalue::Future& f) {
    const auto at = Clock::now();
    {
      std::lock_guard<std::mutex> lock(signal->mu);
      backend->done = true;
      backend->at = at;
      if (f.hasError()) backend->error = f.exception_ptr();
    }
    signal->cv.notify_all();
  });
}

void GlooWork::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(signal_->mu);
  while (!finished_) {
    if (finishing_) {
      // Another waiter runs the (local, short) finishing step: wait for it
      // whatever our deadline, so that we never return before it ran.
      signal_->cv.wait(lock);
      continue;
    }
    if (backend_->done) {
      if (backend_->error) {
        settle_backend_error(backend_->error);
        break;
      }
      finishing_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        if (finish_) finish_();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      finishing_ = false;
      if (error) {
        settle_backend_error(error);
      } else {
        finished_ = true;
        signal_->cv.notify_all();
      }
      break;
    }
    if (signal_->aborted) throw_aborted();
    if (!has_future_ && !backend_waiter_) {
      wait_in_backend(lock, deadline);
      continue;
    }
    if (signal_->cv.wait_until(lock, deadline) == std::cv_status::timeout && !backend_->done &&
        !finishing_ && !finished_ && !signal_->aborted) {
      throw_timeout(timeout);
    }
  }
  if (outcome_) std::rethrow_exception(outcome_);
}

void GlooWork::wait_in_backend(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  backend_waiter_ = true;
  lock.unlock();
  // c10d reads 0 ms as "no timeout"; an expired deadline still gets a poll.
  const auto left = std::max(std::chrono::milliseconds(1),
                             std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  bool ok = false;
  std::exception_ptr error;
  try {
    ok = work_->wait(left);
  } catch (...) {
    error = std::current_exception();
  }
  const auto at = Clock::now();
  lock.lock();
  backend_waiter_ = false;
  if (ok || error) {
    backend_->done = true;
    backend_->at = at;
    backend_->error = error;
  }
  signal_->cv.notify_all();
  if (!backend_->done) {
    if (signal_->aborted) throw_aborted();
    throw_timeout(left);
  }
}

void GlooWork::settle_backend_error(std::exception_ptr error) {
  finished_ = true;
  try {
    if (signal_->aborted) throw_aborted();  // the abort is why it failed
    try {
      std::rethrow_exception(error);
    } catch (...) {
      rethrow_as_comm_error(what_);
    }
  } catch (...) {
    outcome_ = std::current_exception();
  }
  signal_->cv.notify_all();
}

bool GlooWork::is_completed() {
  std::lock_guard<std::mutex> lock(signal_->mu);
  if (finished_ || backend_->done || signal_->aborted) return true;
  return !has_future_ && work_->isCompleted();
}

std::optional<Work::Clock::time_point> GlooWork::completed_at() {
  std::lock_guard<std::mutex> lock(signal_->mu);
  if (backend_->done && !backend_->error) return backend_->at;
  return std::nullopt;
}

void GlooWork::throw_aborted() const {
  throw CommError(fmt::format("{} failed: group aborted on rank {} (ProcessGroup::abort was called); "
                              "the group is unusable, build a new one to continue",
                              what_, signal_->rank));
}

void GlooWork::throw_timeout(std::chrono::milliseconds timeout) const {
  throw TimeoutError(fmt::format("{} did not complete within {} ms; a peer rank may have died or "
                                 "stopped calling the same collectives in the same order",
                                 what_, timeout.count()));
}

void rethrow_as_comm_error(const std::string& what) {
  try {
    throw;
  } catch (const paratrain::Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    // c10::Error carries a backtrace after the first line; keep the message.
    if (auto nl = msg.find("\nException raised from"); nl != std::string::npos) msg.resize(nl);
    const bool timed_out = msg.find("imed out") != std::string::npos ||
                           msg.find("timeout") != std::string::npos;
    if (timed_out) {
      throw TimeoutError(fmt::format("{} timed out: {}. A peer rank may have died or stopped "
                                     "participating; check the other ranks' logs",
                                     what, msg));
    }
    throw CommError(fmt::format("{} failed: {}. A peer rank probably exited; check its log", what, msg));
  }
}

}  // namespace paratrain::comm::gloo_detail

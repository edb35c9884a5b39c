// WorkerWork: a Work that a group's own worker thread completes, waited on
// through a condition variable. The shm and hierarchical groups run their
// collectives on such a thread; this is the handle their callers hold.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"
#include "paratrain/core/running_deadline.h"

namespace paratrain::comm {

/// Completed (or failed) once by finish(); wait() throws TimeoutError naming
/// the operation when that does not happen in time, or rethrows its error.
class WorkerWork final : public Work {
 public:
  WorkerWork(std::string what, std::chrono::milliseconds timeout) : what_(std::move(what)), timeout_(timeout) {}

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    RunningDeadline deadline(timeout);  // Note [Deadlines that stop with the process]
    while (!done_ && !error_) {
      if (deadline.passed())
        throw TimeoutError(fmt::format("{} did not complete within {} ms: a peer rank may be slow, stopped, or "
                                       "skipped this operation",
                                       what_, timeout.count()));
      cv_.wait_until(lock, deadline.next_look());
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    std::lock_guard lock(mu_);
    return done_ || error_;
  }
  std::optional<Clock::time_point> completed_at() override {
    std::lock_guard lock(mu_);
    return at_;
  }

  void finish(std::exception_ptr error) {
    {
      std::lock_guard lock(mu_);
      if (error)
        error_ = error;
      else {
        done_ = true;
        at_ = Clock::now();
      }
    }
    cv_.notify_all();
  }
  const std::string& what() const { return what_; }

 protected:
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::optional<Clock::time_point> at_;
};

}  // namespace paratrain::comm

// GlooWork: see gloo_work.h. Every Work of a group shares the group's mutex
// and condition variable, so abort() wakes all waiters with one notify.
#include "paratrain/comm/gloo/gloo_work.h"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/ivalue.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/running_deadline.h"

namespace paratrain::comm::gloo_detail {
namespace {

// Note [Threads that wait in c10d]
// c10d's send and receive can only be waited for (no future, Note [Gloo's
// deadline is ours]), so each waits on a thread of its own. Starting a
// thread per message doubled a small message's round trip against c10d's
// (bench/sendrecv_latency); a pool keeps them: an operation takes an idle
// thread, or a new one starts when none is idle (never a queue: a receive
// that waits for its peer must not hold up a send behind it), and a thread
// idle for kIdle ends. The pool is never destroyed: its idle threads wait
// on it at process exit.
class WaiterPool {
 public:
  static WaiterPool& instance() {
    static auto* pool = new WaiterPool;
    return *pool;
  }

  // Runs `job` on a thread now; throws std::system_error when none can start.
  void run(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        Waiter* w = idle_.back();
        idle_.pop_back();
        w->job = std::move(job);
        w->cv.notify_one();
        return;
      }
    }
    std::thread([this, job = std::move(job)]() mutable { serve(std::move(job)); }).detach();
  }

 private:
  static constexpr auto kIdle = std::chrono::seconds(30);
  struct Waiter {
    std::function<void()> job;  // guarded by mu_
    std::condition_variable cv;
  };

  void serve(std::function<void()> job) {
    Waiter self;
    while (true) {
      job();
      job = nullptr;  // what it held goes now, not when the thread is next used
      std::unique_lock<std::mutex> lock(mu_);
      idle_.push_back(&self);
      if (!self.cv.wait_for(lock, kIdle, [&] { return static_cast<bool>(self.job); })) {
        std::erase(idle_, &self);  // nobody handed it a job
        return;
      }
      job = std::move(self.job);
      self.job = nullptr;
    }
  }

  std::mutex mu_;
  std::vector<Waiter*> idle_;  // guarded by mu_
};

}  // namespace

GlooWork::GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> finish,
                   std::shared_ptr<GroupSignal> signal, std::chrono::milliseconds default_timeout, bool has_future)
    : work_(std::move(work)), what_(std::move(what)), finish_(std::move(finish)),
      signal_(std::move(signal)), default_timeout_(default_timeout) {
  if (!work_) {
    backend_->done = true;
    backend_->at = Clock::now();
    return;
  }
  c10::intrusive_ptr<c10::ivalue::Future> future;
  if (has_future) {
    try {
      future = work_->getFuture();
    } catch (...) {
      // No future after all: waited for on a thread below.
    }
  }
  {
    std::lock_guard<std::mutex> lock(signal_->mu);
    ++signal_->in_flight;
  }
  if (!future) {
    wait_in_backend_thread();
    return;
  }
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
      --signal->in_flight;
    }
    signal->cv.notify_all();
  });
}

// On a thread of the pool (Note [Threads that wait in c10d]): the job holds
// what it touches, and ends when the operation does, when the group's
// connections are failed (abort, or the group's end with operations in
// flight), or at Gloo's backstop. It lets go of the c10d work before it
// counts the operation as ended: the group's destructor waits for that
// count, so Gloo's context never outlives the group on this thread.
void GlooWork::wait_in_backend_thread() {
  try {
    WaiterPool::instance().run([work = work_, backend = backend_, signal = signal_]() mutable {
      bool ok = false;
      std::exception_ptr error;
      try {
        ok = work->wait(std::chrono::duration_cast<std::chrono::milliseconds>(kGlooBackstop));
      } catch (...) {
        error = std::current_exception();
      }
      if (!ok && !error)
        error = std::make_exception_ptr(CommError("the operation ended in Gloo without completing"));
      work.reset();
      const auto at = Clock::now();
      {
        std::lock_guard<std::mutex> lock(signal->mu);
        backend->done = true;
        backend->at = at;
        backend->error = error;
        --signal->in_flight;
      }
      signal->cv.notify_all();
    });
  } catch (...) {  // no thread: the operation fails now
    std::lock_guard<std::mutex> lock(signal_->mu);
    backend_->done = true;
    backend_->at = Clock::now();
    backend_->error = std::current_exception();
    --signal_->in_flight;
  }
}

void GlooWork::wait(std::chrono::milliseconds timeout) {
  RunningDeadline deadline(timeout);  // Note [Gloo's deadline is ours]
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
    if (deadline.passed()) throw_timeout(timeout);
    signal_->cv.wait_until(lock, deadline.next_look());
  }
  if (outcome_) std::rethrow_exception(outcome_);
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
  return finished_ || backend_->done || signal_->aborted;
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

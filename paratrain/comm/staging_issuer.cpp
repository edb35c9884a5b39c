// The issuing thread of the staging decorator: see staging_issuer.h.
#include "paratrain/comm/staging_issuer.h"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "paratrain/core/error.h"

namespace paratrain::comm::staging_detail {

void Job::settle(WorkHandle work, std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    inner = std::move(work);
    error = std::move(e);
    issued = true;
  }
  cv.notify_all();
}

WorkHandle Job::await(RunningDeadline& deadline) {
  std::unique_lock<std::mutex> lock(mu);
  while (!issued) {
    if (deadline.passed())
      throw TimeoutError(fmt::format("staged operation not started after {} ms: its device-to-host copy did not "
                                     "finish (the GPU is stuck or gone)",
                                     deadline.timeout().count()));
    cv.wait_until(lock, deadline.next_look());
  }
  if (error) std::rethrow_exception(error);
  return inner;
}

Issuer::~Issuer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  fail_queued("group destroyed");
}

std::variant<WorkHandle, std::shared_ptr<Job>> Issuer::submit(std::function<WorkHandle()> issue,
                                                      std::shared_ptr<c10::Event> ready, bool defer) {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && !defer) return issue();  // after abort() the inner group refuses it itself
  if (aborted_) throw CommError("staged operation refused: group aborted");
  auto job = std::make_shared<Job>();
  job->issue = std::move(issue);
  job->ready = std::move(ready);
  queue_.push_back(job);
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  lock.unlock();
  cv_.notify_all();
  return job;
}

void Issuer::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() || aborted_; });
}

void Issuer::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
  fail_queued("group aborted");
}

void Issuer::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || aborted_ || !queue_.empty(); });
      if (stop_ || aborted_) return;
      job = queue_.front();  // stays queued until issued: later submits queue behind it
    }
    if (job->ready) {
      try {
        while (!job->ready->query()) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_ || aborted_) return;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      } catch (const std::exception& e) {
        // A device error (the copy failed, the GPU fell off): this job and
        // every one behind it fail with it; the group cannot go on.
        const std::string why = fmt::format("the device-to-host copy failed: {}", e.what());
        {
          std::lock_guard<std::mutex> lock(mu_);
          aborted_ = true;
        }
        fail_queued(why.c_str());
        return;
      }
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_ || aborted_) return;
    WorkHandle work;
    std::exception_ptr error;
    try {
      work = job->issue();
    } catch (...) {
      error = std::current_exception();
    }
    queue_.pop_front();
    const bool now_idle = queue_.empty();
    lock.unlock();
    job->settle(std::move(work), std::move(error));
    if (now_idle) idle_.notify_all();
  }
}

void Issuer::fail_queued(const char* why) {
  std::deque<std::shared_ptr<Job>> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed.swap(queue_);
  }
  for (auto& job : failed) job->settle(nullptr, std::make_exception_ptr(CommError(fmt::format("staged operation not started: {}", why))));
  idle_.notify_all();
}

}  // namespace paratrain::comm::staging_detail

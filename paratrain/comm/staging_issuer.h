// The issuing thread of comm/host_staging_group.cpp (Note [Staging off the
// caller's stream]): operations start on the inner group in the order they
// were issued, each once its device-to-host copy is done. Internal to the
// staging decorator; a header of its own so the decorator's file holds the
// copies and this one the ordering.
#pragma once

#include <c10/core/Event.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <variant>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/running_deadline.h"

namespace paratrain::comm::staging_detail {

// One operation waiting for the issuing thread.
struct Job {
  std::function<WorkHandle()> issue;  // starts the inner operation on the host buffers
  std::shared_ptr<c10::Event> ready;  // the device-to-host copies are done (null: none)
  std::mutex mu;
  std::condition_variable cv;
  bool issued = false;  // guarded by mu
  WorkHandle inner;
  std::exception_ptr error;

  void settle(WorkHandle work, std::exception_ptr e);
  // The inner work once issued; rethrows an issue failure; TimeoutError at `deadline`.
  WorkHandle await(RunningDeadline& deadline);
};

// Starts inner operations in issue order.
class Issuer {
 public:
  Issuer() = default;
  Issuer(const Issuer&) = delete;
  Issuer& operator=(const Issuer&) = delete;
  ~Issuer();

  // Issues `issue` at once when nothing is queued and `defer` is false;
  // queues it otherwise (after `ready`, when given). Returns the job (queued)
  // or the inner work (direct).
  std::variant<WorkHandle, std::shared_ptr<Job>> submit(std::function<WorkHandle()> issue,
                                                        std::shared_ptr<c10::Event> ready, bool defer);
  // Until every queued operation was issued (before a collective that
  // bypasses the queue, such as making a sub-group).
  void drain();
  // Fails every queued operation; later deferred ones are refused.
  void abort();

 private:
  void run();
  void fail_queued(const char* why);

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  bool aborted_ = false;
  std::thread thread_;
};

}  // namespace paratrain::comm::staging_detail

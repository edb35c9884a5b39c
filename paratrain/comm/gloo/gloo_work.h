// A c10d Work wrapped as our Work: converts c10d/gloo exceptions into
// CommError/TimeoutError, runs a finishing step exactly once after the data
// arrived, stamps the completion time, and fails promptly when the group is
// aborted. Not here: issuing operations (gloo_group.cpp).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm::gloo_detail {

// Shared by a group and all its Works: one mutex guards every Work's state
// (a handful of operations are in flight at a time, so contention is nil),
// and one condition variable wakes waiters on completion and on abort.
struct GroupSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;  // guarded by mu
  int rank = 0;
  int in_flight = 0;     // guarded by mu: operations whose backend has not ended
};

// Note [Gloo's deadline is ours]
// Gloo enforces a timeout of its own on every wait inside an operation,
// measured on the monotonic clock, which runs on while the process is
// stopped: a job suspended for longer than world.timeout_s (gang
// scheduling, Ctrl-Z) would fail every operation in flight on waking,
// whichever rank continued first. So Gloo's own timeout is a backstop
// (kGlooBackstop, a week) and world.timeout_s is kept here, in time the
// process ran (Note [Deadlines that stop with the process]). Gloo closed
// every connection of the group at its timeout; ours leaves them be, so
// each rank of a hung collective times out on its own deadline and says so
// (the hang doctor's dumps need that), and the operation stays in flight.
// A group destroyed with operations in flight puts its connections into
// Gloo's error state first (as abort() does), which ends them instead of
// holding c10d's threads, which its destructor joins, for the backstop.
// All but one kind: Gloo's error path (tcp Pair::signalException) wakes
// the buffers waiting for a message to begin and the bound buffers being
// sent, not an unbound buffer whose payload is being read or written when
// the connection ends (a link cut mid-message, a peer that closed while
// sending to us or receiving from us), so that operation waits out the
// backstop. Its wait here still ends at world.timeout_s or on abort, but
// the group's teardown would join the stuck thread: a group whose
// operations have not ended a few seconds after its connections failed is
// left behind, c10d's group with it, and says so. A leak of a broken
// group's buffers, once, on the way to an error (or to a rebuilt world).
// c10d's send and receive have no future to be told of completion: a
// thread waits in c10d for each of them, a pool's (Note [Threads that wait
// in c10d] in gloo_work.cpp).
inline constexpr std::chrono::hours kGlooBackstop{24 * 7};

class GlooWork final : public Work {
 public:
  // `work` may be null for an operation with nothing to exchange (done at
  // once). `finish` runs once, after the c10d work completed (e.g. AVG's
  // division or copying the local shard out of a scratch buffer).
  // `has_future` false: c10d's work has no future (send/recv in 1.13). Asking
  // such a work for one throws a c10::Error, whose backtrace capture costs
  // about a millisecond: more than sending a pipeline activation. A thread
  // waits in c10d for it instead (Note [Gloo's deadline is ours]).
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> finish,
           std::shared_ptr<GroupSignal> signal, std::chrono::milliseconds default_timeout, bool has_future = true);

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;
  // Exact (stamped by a callback on the c10d future) for every collective;
  // send/recv have no future in c10d 1.13, so theirs is when the thread
  // waiting in c10d saw the operation finish.
  std::optional<Clock::time_point> completed_at() override;

 protected:
  std::chrono::milliseconds default_timeout() const override { return default_timeout_; }

 private:
  // A thread that waits in c10d itself (send/recv have no future).
  void wait_in_backend_thread();
  void settle_backend_error(std::exception_ptr error);  // lock held
  [[noreturn]] void throw_aborted() const;
  [[noreturn]] void throw_timeout(std::chrono::milliseconds timeout) const;

  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;  // "rank 1: all_reduce(sum, 4096 floats)" for messages
  std::function<void()> finish_;
  std::shared_ptr<GroupSignal> signal_;
  std::chrono::milliseconds default_timeout_;

  // Guarded by signal_->mu. The state shared with the future's callback lives
  // in `backend_`, which the callback holds on its own (it may outlive us).
  struct Backend {
    bool done = false;
    std::exception_ptr error;  // as c10d reported it
    std::optional<Clock::time_point> at;
  };
  std::shared_ptr<Backend> backend_ = std::make_shared<Backend>();
  bool finishing_ = false;       // a thread is running finish_
  bool finished_ = false;        // wait() has its final outcome
  std::exception_ptr outcome_;   // the error every wait() rethrows, if any
};

// Rethrows the current exception as CommError/TimeoutError prefixed by `what`.
[[noreturn]] void rethrow_as_comm_error(const std::string& what);

}  // namespace paratrain::comm::gloo_detail

// GlooWork: see gloo_work.h.
#include "paratrain/comm/gloo/gloo_work.h"

#include <exception>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::comm::gloo_detail {

GlooWork::GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> finish)
    : work_(std::move(work)), what_(std::move(what)), finish_(std::move(finish)) {}

void GlooWork::wait(std::chrono::milliseconds timeout) {
  if (done_) return;
  bool ok = false;
  try {
    ok = work_->wait(timeout);
  } catch (...) {
    rethrow_as_comm_error(what_);
  }
  if (!ok) {
    throw TimeoutError(fmt::format("{} did not complete within {} ms; a peer rank may have died or "
                                   "stopped calling the same collectives in the same order",
                                   what_, timeout.count()));
  }
  if (finish_) finish_();
  done_ = true;
}

bool GlooWork::is_completed() { return done_ || work_->isCompleted(); }

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

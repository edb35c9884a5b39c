// A c10d Work wrapped as our Work: converts c10d/gloo exceptions into
// CommError/TimeoutError and runs a finishing step once the data arrived.
#pragma once

#include <functional>
#include <string>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm::gloo_detail {

class GlooWork final : public Work {
 public:
  // `finish` runs once, after the c10d work completed (e.g. AVG's division
  // or copying the local shard out of a scratch buffer).
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> finish = {});

  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;  // "rank 1: all_reduce(sum, 4096 floats)" for messages
  std::function<void()> finish_;
  bool done_ = false;
};

// Rethrows the current exception as CommError/TimeoutError prefixed by `what`.
[[noreturn]] void rethrow_as_comm_error(const std::string& what);

}  // namespace paratrain::comm::gloo_detail

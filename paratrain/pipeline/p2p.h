// Point-to-point transfers between pipeline neighbours on the pp group:
// sends are non-blocking (the tensor is kept alive until drained), receives
// are posted ahead of need and waited for only when the data is used, so
// transfers overlap compute. Shapes are never sent: both sides derive them
// from the config (stage.h infer_boundary_shapes). Not the schedule.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::pipeline {

enum class Payload { kActivation = 0, kGradient = 1 };

// One tag per (payload, receiving model chunk, micro-batch): a message can
// only match the receive it was meant for, whatever order ranks post them in.
int message_tag(Payload payload, int model_chunk, int microbatch);

class P2p {
 public:
  // `pp` must outlive this object; `timeout` bounds every wait.
  // Receive buffers are made on `device`: the stage's (a GPU's, with
  // world.device = "cuda"; a host-memory backend stages them).
  P2p(comm::ProcessGroup& pp, std::chrono::milliseconds timeout, c10::Device device = c10::Device(c10::kCPU));
  ~P2p();
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  // Non-blocking: `tensor` (made contiguous) stays alive until drain_sends().
  void send(const at::Tensor& tensor, int dst, int tag);
  // Non-blocking; a second post of the same tag is a no-op.
  void post_recv(int src, int tag, const std::vector<int64_t>& shape, at::ScalarType dtype);
  bool posted(int tag) const { return recvs_.count(tag) != 0; }
  // Waits for the posted receive of `tag` and hands its tensor over.
  // `what` names the message in errors ("activation of micro-batch 3").
  at::Tensor wait_recv(int tag, const std::string& what);
  // Waits for every send still in flight (end of step: buffers may go).
  void drain_sends();
  // Bytes moved by sends since construction (benchmarks).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Pending {
    at::Tensor tensor;
    comm::WorkHandle work;
    int peer = -1;
  };
  comm::ProcessGroup& pp_;
  std::chrono::milliseconds timeout_;
  c10::Device device_;
  std::vector<Pending> sends_;
  std::map<int, Pending> recvs_;
  int64_t bytes_sent_ = 0;
};

}  // namespace paratrain::pipeline

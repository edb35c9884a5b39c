// P2p: see p2p.h.
#include "paratrain/pipeline/p2p.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::pipeline {

int message_tag(Payload payload, int model_chunk, int microbatch) {
  // 2 bits payload, 10 bits chunk, 18 bits micro-batch: fits a positive int.
  TORCH_CHECK(model_chunk >= 0 && model_chunk < (1 << 10), "pipeline: model chunk ", model_chunk, " out of range");
  TORCH_CHECK(microbatch >= 0 && microbatch < (1 << 18), "pipeline: micro-batch ", microbatch, " out of range");
  return (static_cast<int>(payload) << 28) | (model_chunk << 18) | microbatch;
}

P2p::P2p(comm::ProcessGroup& pp, std::chrono::milliseconds timeout, c10::Device device)
    : pp_(pp), timeout_(timeout), device_(device) {}

P2p::~P2p() {
  // Never leave the backend writing into freed tensors: wait quietly (an
  // error is already on its way up when a step failed).
  for (auto& s : sends_) {
    try {
      s.work->wait(timeout_);
    } catch (...) {
    }
  }
  for (auto& [tag, r] : recvs_) {
    try {
      r.work->wait(std::chrono::milliseconds(1));
    } catch (...) {
    }
  }
}

void P2p::send(const at::Tensor& tensor, int dst, int tag) {
  at::Tensor t = tensor.detach().contiguous();
  bytes_sent_ += t.numel() * static_cast<int64_t>(t.element_size());
  sends_.push_back({t, pp_.send(t, dst, tag), dst});
}

void P2p::post_recv(int src, int tag, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  if (recvs_.count(tag) != 0) return;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype).device(device_));
  auto work = pp_.recv(t, src, tag);
  recvs_.emplace(tag, Pending{t, std::move(work), src});
}

at::Tensor P2p::wait_recv(int tag, const std::string& what) {
  auto it = recvs_.find(tag);
  TORCH_CHECK(it != recvs_.end(), "pipeline: waiting for ", what, " that was never posted (tag ", tag, ")");
  Pending p = std::move(it->second);
  recvs_.erase(it);
  try {
    p.work->wait(timeout_);
  } catch (const Error& e) {
    throw CommError(fmt::format("pipeline rank {} (pp group): receiving the {} from pp rank {} (global rank {}) "
                                "failed: {}. That stage probably died or stalled: see its log",
                                pp_.rank(), what, p.peer, pp_.global_ranks().at(p.peer), e.what()));
  }
  return p.tensor;
}

void P2p::drain_sends() {
  for (auto& s : sends_) {
    try {
      s.work->wait(timeout_);
    } catch (const Error& e) {
      throw CommError(fmt::format("pipeline rank {} (pp group): a send to pp rank {} (global rank {}) failed: {}. "
                                  "That stage probably died or stalled: see its log",
                                  pp_.rank(), s.peer, pp_.global_ranks().at(s.peer), e.what()));
    }
  }
  sends_.clear();
}

}  // namespace paratrain::pipeline

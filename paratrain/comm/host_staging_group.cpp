// HostStagingGroup: copy device tensors to the host, run the inner
// operation, copy results back at wait() (see host_staging_group.h).
#include "paratrain/comm/host_staging_group.h"

#include <mutex>
#include <utility>
#include <vector>

namespace paratrain::comm {
namespace {

// A device tensor and its host copy: after the inner operation, the host
// copy's contents go back into the device tensor (outputs only).
struct CopyBack {
  at::Tensor device;
  at::Tensor host;
};

// The inner Work plus what it must copy back, and the host buffers the inner
// operation reads or writes (kept alive until the work is done: "tensors
// passed to the operation must stay alive until wait() returns").
class StagedWork final : public Work {
 public:
  StagedWork(WorkHandle inner, std::vector<CopyBack> outputs, std::vector<at::Tensor> keep,
             std::chrono::milliseconds timeout)
      : inner_(std::move(inner)), outputs_(std::move(outputs)), keep_(std::move(keep)), timeout_(timeout) {}

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    // Two threads may wait on one Work: the copy runs once, and both return
    // after it (call_once blocks the second until the first finished).
    std::call_once(copied_, [&] {
      for (auto& o : outputs_) o.device.copy_(o.host);
      outputs_.clear();
      keep_.clear();
    });
  }
  bool is_completed() override { return inner_->is_completed(); }
  std::optional<Clock::time_point> completed_at() override { return inner_->completed_at(); }

 protected:
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  WorkHandle inner_;
  std::vector<CopyBack> outputs_;
  std::vector<at::Tensor> keep_;
  std::chrono::milliseconds timeout_;
  std::once_flag copied_;
};

class HostStagingGroup final : public ProcessGroup {
 public:
  HostStagingGroup(std::shared_ptr<ProcessGroup> inner, StagingOptions options)
      : inner_(std::move(inner)), options_(options) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  const std::vector<int>& global_ranks() const override { return inner_->global_ranks(); }

  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override {
    if (!staged(tensor)) return inner_->all_reduce(tensor, op);
    Plan p;
    at::Tensor h = p.in_out(tensor);
    return p.issue(inner_->all_reduce(h, op), options_.timeout);
  }
  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override {
    if (!staged(output, input)) return inner_->all_gather(output, input);
    Plan p;
    at::Tensor ho = p.out(output);
    return p.issue(inner_->all_gather(ho, p.in(input)), options_.timeout);
  }
  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (!staged(output, input)) return inner_->reduce_scatter(output, input, op);
    Plan p;
    at::Tensor ho = p.out(output);
    return p.issue(inner_->reduce_scatter(ho, p.in(input), op), options_.timeout);
  }
  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    if (!staged(tensor)) return inner_->broadcast(tensor, root);
    Plan p;
    at::Tensor h = p.in_out(tensor);
    return p.issue(inner_->broadcast(h, root), options_.timeout);
  }
  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override {
    if (!staged(tensor)) return inner_->send(tensor, dst, tag);
    Plan p;
    return p.issue(inner_->send(p.in(tensor), dst, tag), options_.timeout);
  }
  WorkHandle recv(at::Tensor& tensor, int src, int tag) override {
    if (!staged(tensor)) return inner_->recv(tensor, src, tag);
    Plan p;
    at::Tensor h = p.out(tensor);
    return p.issue(inner_->recv(h, src, tag), options_.timeout);
  }
  WorkHandle barrier() override { return inner_->barrier(); }
  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override {
    if (!staged(output, input))
      return inner_->all_to_all(output, input, std::move(output_split_sizes), std::move(input_split_sizes));
    Plan p;
    at::Tensor ho = p.out(output);
    return p.issue(
        inner_->all_to_all(ho, p.in(input), std::move(output_split_sizes), std::move(input_split_sizes)),
        options_.timeout);
  }
  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    if (!staged(tensor)) return inner_->reduce(tensor, root, op);
    Plan p;
    at::Tensor h = p.in_out(tensor);
    return p.issue(inner_->reduce(h, root, op), options_.timeout);
  }
  // gather's output and scatter's input matter on the root only, and may be
  // undefined elsewhere: undefined tensors pass through as they are.
  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override {
    if (!staged(output, input)) return inner_->gather(output, input, root);
    Plan p;
    at::Tensor ho = p.out(output);
    return p.issue(inner_->gather(ho, p.in(input), root), options_.timeout);
  }
  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override {
    if (!staged(output, input)) return inner_->scatter(output, input, root);
    Plan p;
    at::Tensor ho = p.out(output);
    return p.issue(inner_->scatter(ho, p.in(input), root), options_.timeout);
  }
  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override {
    if (!staged(output, input)) return inner_->all_gather_uneven(output, input, counts);
    Plan p;
    at::Tensor ho = p.out(output);
    return p.issue(inner_->all_gather_uneven(ho, p.in(input), counts), options_.timeout);
  }
  void abort() override { inner_->abort(); }
  // Host memory, reduced in place by the inner backend: a CPU tensor passes
  // through this group uncopied, so it stays in the inner group's block.
  at::Tensor allocate_symmetric(int64_t numel, at::ScalarType dtype) override {
    return inner_->allocate_symmetric(numel, dtype);
  }
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    auto sub = inner_->new_subgroup(ranks);
    return sub ? std::make_shared<HostStagingGroup>(std::move(sub), options_) : nullptr;
  }

 private:
  // The host copies of one operation's tensors.
  class Plan {
   public:
    // A tensor the operation reads and writes (all_reduce, broadcast, reduce).
    at::Tensor in_out(const at::Tensor& t) {
      at::Tensor h = copy_to_host(t);
      outputs_.push_back({t, h});
      return h;
    }
    // A tensor the operation only reads.
    at::Tensor in(const at::Tensor& t) {
      if (!t.defined()) return t;
      at::Tensor h = copy_to_host(t);
      keep_.push_back(h);
      return h;
    }
    // A tensor the operation only writes.
    at::Tensor out(const at::Tensor& t) {
      if (!t.defined()) return t;
      at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU));
      outputs_.push_back({t, h});
      return h;
    }
    WorkHandle issue(WorkHandle inner, std::chrono::milliseconds timeout) {
      return std::make_shared<StagedWork>(std::move(inner), std::move(outputs_), std::move(keep_), timeout);
    }

   private:
    // clone() for CPU tensors (tests), a copy across otherwise. Synchronous:
    // the data is on the host when the inner operation reads it.
    static at::Tensor copy_to_host(const at::Tensor& t) { return t.is_cpu() ? t.clone() : t.to(at::kCPU); }
    std::vector<CopyBack> outputs_;
    std::vector<at::Tensor> keep_;
  };

  bool staged(const at::Tensor& t) const { return t.defined() && (options_.stage_cpu_tensors || !t.is_cpu()); }
  bool staged(const at::Tensor& a, const at::Tensor& b) const { return staged(a) || staged(b); }

  std::shared_ptr<ProcessGroup> inner_;
  StagingOptions options_;
};

}  // namespace

std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> inner, StagingOptions options) {
  return std::make_shared<HostStagingGroup>(std::move(inner), options);
}

}  // namespace paratrain::comm

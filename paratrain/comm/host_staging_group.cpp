// HostStagingGroup: copy device tensors to the host, run the inner
// operation, copy results back at wait() (see host_staging_group.h).
#include "paratrain/comm/host_staging_group.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "paratrain/comm/staging_issuer.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {

// Note [Staging off the caller's stream]
// DDP issues a bucket's all-reduce from a backward hook, on the thread that
// launches the backward kernels. A synchronous device-to-host copy there
// waits for every kernel queued so far, and no new one is launched while it
// waits: backward and communication take turns. With `overlap`:
// - at issue, an event recorded on the caller's stream makes the group's
//   side stream wait for the gradient, and the device-to-host copy into
//   pinned memory is queued on the side stream; the caller goes on at once;
// - the group's issuing thread takes operations in issue order, waits for
//   each one's copy (its event), then starts the inner operation. Every
//   operation of the group passes through that order, also those on host
//   tensors that need no copy, while any is queued: ranks issue the same
//   sequence, so the inner backend still sees the same order on every rank;
// - at wait(), the result's host-to-device copy is queued on the side stream
//   (after what the waiter's stream did so far) and the waiter's stream is
//   made to wait for it: the host returns once the data arrived in host
//   memory, the GPU orders the copy before whatever the waiter queues next.
// The caching allocators stay safe: device memory used on the side stream
// is recorded on it, and pinned blocks keep their copy's event.

namespace {

using staging_detail::Issuer;
using staging_detail::Job;

// A device tensor and its host copy: after the inner operation, the host
// copy's contents go back into the device tensor (outputs only).
struct CopyBack {
  at::Tensor device;
  at::Tensor host;
};

// The streams of the device a group's tensors live on (one GPU per rank).
// Device-generic (c10's VirtualGuardImpl) so CPU-only builds compile it.
class SideStream {
 public:
  explicit SideStream(c10::Device device)
      : device_(device), impl_(device.type()), stream_(impl_.getStreamFromGlobalPool(device, false)) {}
  c10::Device device() const { return device_; }
  // An event recorded now on `from`, that `to` waits for.
  void order_after(const c10::Stream& from, const c10::Stream& to) const {
    c10::Event e(device_.type());
    e.record(from);
    e.block(to);
  }
  c10::Stream current() const { return impl_.getStream(device_); }
  const c10::Stream& side() const { return stream_; }
  std::shared_ptr<c10::Event> record_on_side() const {
    auto e = std::make_shared<c10::Event>(device_.type());
    e->record(stream_);
    return e;
  }
  // The caching allocator must not hand `t`'s memory to another stream's
  // work before the side stream is done with it.
  void used_on_side(const at::Tensor& t) const { impl_.recordDataPtrOnStream(t.storage().data_ptr(), stream_); }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream stream_;
};

// The inner Work (or the job that will start it) plus what it must copy
// back, and the host buffers the inner operation reads or writes (kept
// alive until the work is done: "tensors passed to the operation must stay
// alive until wait() returns").
class StagedWork final : public Work {
 public:
  StagedWork(std::variant<WorkHandle, std::shared_ptr<Job>> work, std::vector<CopyBack> outputs,
             std::vector<at::Tensor> keep, std::shared_ptr<SideStream> streams, std::chrono::milliseconds timeout)
      : outputs_(std::move(outputs)), keep_(std::move(keep)), streams_(std::move(streams)), timeout_(timeout) {
    if (auto* direct = std::get_if<WorkHandle>(&work)) inner_ = std::move(*direct);
    else job_ = std::get<std::shared_ptr<Job>>(std::move(work));
  }

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override {
    RunningDeadline deadline(timeout);  // Note [Deadlines that stop with the process]
    WorkHandle inner = inner_ ? inner_ : job_->await(deadline);
    deadline.passed();
    inner->wait(deadline.left());
    // Two threads may wait on one Work: the copy runs once, and both return
    // after it (call_once blocks the second until the first finished).
    std::call_once(copied_, [&] {
      copy_back();
      outputs_.clear();
      keep_.clear();
    });
  }
  bool is_completed() override {
    if (inner_) return inner_->is_completed();
    std::lock_guard<std::mutex> lock(job_->mu);
    return job_->issued && (job_->error || job_->inner->is_completed());
  }
  std::optional<Clock::time_point> completed_at() override {
    if (inner_) return inner_->completed_at();
    std::lock_guard<std::mutex> lock(job_->mu);
    return job_->issued && job_->inner ? job_->inner->completed_at() : std::nullopt;
  }

 protected:
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  void copy_back() {
    at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
    bool on_side = false;
    std::optional<c10::Stream> waiter;
    for (auto& o : outputs_) {
      if (!streams_ || o.device.is_cpu()) {
        o.device.copy_(o.host);
        continue;
      }
      if (!on_side) {
        waiter = streams_->current();
        streams_->order_after(*waiter, streams_->side());  // after what the waiter queued so far
        on_side = true;
      }
      c10::StreamGuard guard(streams_->side());
      o.device.copy_(o.host, /*non_blocking=*/true);
      streams_->used_on_side(o.device);
    }
    if (on_side) streams_->order_after(streams_->side(), *waiter);
  }

  WorkHandle inner_;
  std::shared_ptr<Job> job_;
  std::vector<CopyBack> outputs_;
  std::vector<at::Tensor> keep_;
  std::shared_ptr<SideStream> streams_;
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
    if (!staged(tensor)) return pass([=, this]() mutable { return inner_->all_reduce(tensor, op); });
    Plan p = plan();
    at::Tensor h = p.in_out(tensor);
    return issue(p, [=, this]() mutable { return inner_->all_reduce(h, op); });
  }
  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override {
    if (!staged(output, input)) return pass([=, this]() mutable { return inner_->all_gather(output, input); });
    Plan p = plan();
    at::Tensor ho = p.out(output);
    at::Tensor hi = p.in(input);
    return issue(p, [=, this]() mutable { return inner_->all_gather(ho, hi); });
  }
  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (!staged(output, input))
      return pass([=, this]() mutable { return inner_->reduce_scatter(output, input, op); });
    Plan p = plan();
    at::Tensor ho = p.out(output);
    at::Tensor hi = p.in(input);
    return issue(p, [=, this]() mutable { return inner_->reduce_scatter(ho, hi, op); });
  }
  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    if (!staged(tensor)) return pass([=, this]() mutable { return inner_->broadcast(tensor, root); });
    Plan p = plan();
    at::Tensor h = p.in_out(tensor);
    return issue(p, [=, this]() mutable { return inner_->broadcast(h, root); });
  }
  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override {
    if (!staged(tensor)) return pass([=, this]() { return inner_->send(tensor, dst, tag); });
    Plan p = plan();
    at::Tensor h = p.in(tensor);
    return issue(p, [=, this]() { return inner_->send(h, dst, tag); });
  }
  WorkHandle recv(at::Tensor& tensor, int src, int tag) override {
    if (!staged(tensor)) return pass([=, this]() mutable { return inner_->recv(tensor, src, tag); });
    Plan p = plan();
    at::Tensor h = p.out(tensor);
    return issue(p, [=, this]() mutable { return inner_->recv(h, src, tag); });
  }
  WorkHandle barrier() override {
    return pass([this] { return inner_->barrier(); });
  }
  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override {
    if (!staged(output, input))
      return pass([=, this]() mutable {
        return inner_->all_to_all(output, input, output_split_sizes, input_split_sizes);
      });
    Plan p = plan();
    at::Tensor ho = p.out(output);
    at::Tensor hi = p.in(input);
    return issue(p, [=, this]() mutable { return inner_->all_to_all(ho, hi, output_split_sizes, input_split_sizes); });
  }
  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    if (!staged(tensor)) return pass([=, this]() mutable { return inner_->reduce(tensor, root, op); });
    Plan p = plan();
    at::Tensor h = p.in_out(tensor);
    return issue(p, [=, this]() mutable { return inner_->reduce(h, root, op); });
  }
  // gather's output and scatter's input matter on the root only, and may be
  // undefined elsewhere: undefined tensors pass through as they are.
  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override {
    if (!staged(output, input)) return pass([=, this]() mutable { return inner_->gather(output, input, root); });
    Plan p = plan();
    at::Tensor ho = p.out(output);
    at::Tensor hi = p.in(input);
    return issue(p, [=, this]() mutable { return inner_->gather(ho, hi, root); });
  }
  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override {
    if (!staged(output, input)) return pass([=, this]() mutable { return inner_->scatter(output, input, root); });
    Plan p = plan();
    at::Tensor ho = p.out(output);
    at::Tensor hi = p.in(input);
    return issue(p, [=, this]() mutable { return inner_->scatter(ho, hi, root); });
  }
  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override {
    if (!staged(output, input))
      return pass([=, this]() mutable { return inner_->all_gather_uneven(output, input, counts); });
    Plan p = plan();
    at::Tensor ho = p.out(output);
    at::Tensor hi = p.in(input);
    return issue(p, [=, this]() mutable { return inner_->all_gather_uneven(ho, hi, counts); });
  }
  void abort() override {
    issuer_.abort();
    inner_->abort();
  }
  // Host memory, reduced in place by the inner backend: a CPU tensor passes
  // through this group uncopied, so it stays in the inner group's block.
  at::Tensor allocate_symmetric(int64_t numel, at::ScalarType dtype) override {
    issuer_.drain();
    return inner_->allocate_symmetric(numel, dtype);
  }
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    issuer_.drain();  // the inner group's own collectives after everything issued before
    auto sub = inner_->new_subgroup(ranks);
    return sub ? std::make_shared<HostStagingGroup>(std::move(sub), options_) : nullptr;
  }

 private:
  // The host copies of one operation's tensors.
  class Plan {
   public:
    Plan(bool overlap, std::shared_ptr<SideStream> streams) : overlap_(overlap), streams_(std::move(streams)) {}
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
      at::Tensor h = at::empty(t.sizes(), host_options(t));
      outputs_.push_back({t, h});
      return h;
    }
    std::shared_ptr<c10::Event> ready() const { return copied_on_side_ ? streams_->record_on_side() : nullptr; }
    std::vector<CopyBack> outputs_;
    std::vector<at::Tensor> keep_;
    std::shared_ptr<SideStream> streams_;

   private:
    bool async_device(const at::Tensor& t) const { return overlap_ && streams_ && !t.is_cpu(); }
    at::TensorOptions host_options(const at::Tensor& t) const {
      return t.options().device(at::kCPU).pinned_memory(async_device(t));
    }
    // clone() for CPU tensors (tests); for a device tensor a synchronous copy,
    // or with overlap one queued on the side stream after the caller's work.
    at::Tensor copy_to_host(const at::Tensor& t) {
      at::NoGradGuard no_grad;
      if (t.is_cpu()) return t.clone();
      if (!async_device(t)) return t.to(at::kCPU);
      if (!copied_on_side_) streams_->order_after(streams_->current(), streams_->side());
      copied_on_side_ = true;
      at::Tensor h = at::empty(t.sizes(), host_options(t));
      c10::StreamGuard guard(streams_->side());
      h.copy_(t, /*non_blocking=*/true);
      streams_->used_on_side(t);
      return h;
    }
    bool overlap_ = false;
    bool copied_on_side_ = false;
  };

  Plan plan() {
    std::lock_guard<std::mutex> lock(streams_mu_);
    return Plan(options_.overlap, streams_);
  }

  // An operation on unstaged tensors: through the issuing order while staged
  // operations wait there (Note [Staging off the caller's stream]).
  WorkHandle pass(std::function<WorkHandle()> call) {
    auto work = issuer_.submit(std::move(call), nullptr, /*defer=*/false);
    if (auto* direct = std::get_if<WorkHandle>(&work)) return *direct;
    return std::make_shared<StagedWork>(std::move(work), std::vector<CopyBack>{}, std::vector<at::Tensor>{}, nullptr,
                                        options_.timeout);
  }
  WorkHandle issue(Plan& p, std::function<WorkHandle()> call) {
    // An operation waiting for its copy takes the issuing thread's turn (then
    // its argument errors surface at wait(), not here).
    auto ready = p.ready();
    const bool defer = ready != nullptr || options_.issue_on_thread;
    auto work = issuer_.submit(std::move(call), std::move(ready), defer);
    return std::make_shared<StagedWork>(std::move(work), std::move(p.outputs_), std::move(p.keep_), p.streams_,
                                        options_.timeout);
  }

  bool staged(const at::Tensor& t) {
    if (!t.defined() || !(options_.stage_cpu_tensors || !t.is_cpu())) return false;
    if (!t.is_cpu() && options_.overlap) {
      std::lock_guard<std::mutex> lock(streams_mu_);
      if (!streams_) streams_ = std::make_shared<SideStream>(t.device());
    }
    return true;
  }
  bool staged(const at::Tensor& a, const at::Tensor& b) {
    const bool sa = staged(a);
    const bool sb = staged(b);
    return sa || sb;
  }

  std::shared_ptr<ProcessGroup> inner_;
  StagingOptions options_;
  std::mutex streams_mu_;
  std::shared_ptr<SideStream> streams_;  // the device of the first staged GPU tensor
  Issuer issuer_;
};

}  // namespace

std::shared_ptr<ProcessGroup> stage_through_host(std::shared_ptr<ProcessGroup> inner, StagingOptions options) {
  return std::make_shared<HostStagingGroup>(std::move(inner), options);
}

}  // namespace paratrain::comm

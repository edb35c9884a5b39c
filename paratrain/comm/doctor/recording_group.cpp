// RecordingGroup: record, forward, and stamp the end when the work completes
// (see recording_group.h).
#include "paratrain/comm/doctor/recording_group.h"

#include <utility>

#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

thread_local double collective_seconds = 0;
thread_local int collective_depth = 0;

// Adds the time from construction to destruction to this thread's
// collective time, unless an enclosing one already counts it.
class CollectiveClock {
 public:
  CollectiveClock() : outer_(collective_depth++ == 0), start_(std::chrono::steady_clock::now()) {}
  ~CollectiveClock() {
    --collective_depth;
    if (outer_) collective_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  CollectiveClock(const CollectiveClock&) = delete;
  CollectiveClock& operator=(const CollectiveClock&) = delete;

 private:
  bool outer_;
  std::chrono::steady_clock::time_point start_;
};

// A group aborted by a watcher (peer_watch.h) fails its waiters with the
// backend's "group aborted"; the watcher's reason (which rank went silent,
// where, in which collective) is what the user needs, so it goes first.
[[noreturn]] void rethrow_with_abort_reason(const FlightRecorder& recorder, const CommError& e) {
  const std::string reason = recorder.abort_reason();
  if (reason.empty()) throw;
  throw CommError(reason + " (" + e.what() + ")");
}

// The inner Work plus the record it ends. The end is stamped by whoever first
// sees the work complete (wait() or is_completed()), with the backend's own
// completion time when it knows one: a rank that waits late still records
// when the data arrived.
class RecordedWork : public Work {
 public:
  RecordedWork(WorkHandle inner, std::shared_ptr<FlightRecorder> recorder, uint64_t ticket,
               std::chrono::milliseconds timeout, bool dump_on_timeout)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), ticket_(ticket), timeout_(timeout),
        dump_on_timeout_(dump_on_timeout) {}

  void wait(std::chrono::milliseconds timeout) override {
    const CollectiveClock clock;
    try {
      inner_->wait(timeout);
    } catch (const TimeoutError&) {
      recorder_->finish(ticket_, RecordState::kTimedOut, -1);
      if (dump_on_timeout_) recorder_->dump("collective timeout");
      throw;
    } catch (const CommError& e) {
      recorder_->finish(ticket_, RecordState::kFailed, -1);
      rethrow_with_abort_reason(*recorder_, e);
    } catch (...) {
      recorder_->finish(ticket_, RecordState::kFailed, -1);
      throw;
    }
    stamp();
  }
  bool is_completed() override {
    const bool done = inner_->is_completed();
    if (done) stamp();
    return done;
  }
  std::optional<Clock::time_point> completed_at() override { return inner_->completed_at(); }

 protected:
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  void stamp() {
    const auto at = inner_->completed_at();
    const int64_t end = at ? std::chrono::duration_cast<std::chrono::microseconds>(at->time_since_epoch()).count()
                           : FlightRecorder::now_us();
    recorder_->finish(ticket_, RecordState::kDone, end);
  }

  WorkHandle inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t ticket_;
  std::chrono::milliseconds timeout_;
  bool dump_on_timeout_;
};

}  // namespace

double thread_collective_seconds() { return collective_seconds; }

RecordingGroup::RecordingGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<FlightRecorder> recorder,
                               RecordingOptions options)
    : inner_(std::move(inner)), recorder_(std::move(recorder)), options_(std::move(options)) {
  id_ = recorder_->add_group(options_.name, inner_->global_ranks());
}

template <class Issue>
WorkHandle RecordingGroup::record(const char* op, const at::Tensor* tensor, int peer, Issue&& issue) {
  const CollectiveClock clock;  // a backend may block already here (shm's slots)
  const uint64_t ticket = recorder_->begin(id_, op, tensor, peer);
  WorkHandle work;
  try {
    work = issue();
  } catch (const TimeoutError&) {
    recorder_->finish(ticket, RecordState::kFailed, -1);
    throw;
  } catch (const CommError& e) {
    recorder_->finish(ticket, RecordState::kFailed, -1);
    rethrow_with_abort_reason(*recorder_, e);
  } catch (...) {
    recorder_->finish(ticket, RecordState::kFailed, -1);
    throw;
  }
  return std::make_shared<RecordedWork>(std::move(work), recorder_, ticket, options_.timeout,
                                        options_.dump_on_timeout);
}

WorkHandle RecordingGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  return record("all_reduce", &tensor, -1, [&] { return inner_->all_reduce(tensor, op); });
}
WorkHandle RecordingGroup::all_gather(at::Tensor& output, const at::Tensor& input) {
  return record("all_gather", &input, -1, [&] { return inner_->all_gather(output, input); });
}
WorkHandle RecordingGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  return record("reduce_scatter", &input, -1, [&] { return inner_->reduce_scatter(output, input, op); });
}
WorkHandle RecordingGroup::broadcast(at::Tensor& tensor, int root) {
  return record("broadcast", &tensor, root, [&] { return inner_->broadcast(tensor, root); });
}
// Point-to-point ops count in the group's sequence too: a pipeline stage that
// never sends is exactly what the doctor should show.
WorkHandle RecordingGroup::send(const at::Tensor& tensor, int dst, int tag) {
  return record("send", &tensor, dst, [&] { return inner_->send(tensor, dst, tag); });
}
WorkHandle RecordingGroup::recv(at::Tensor& tensor, int src, int tag) {
  return record("recv", &tensor, src, [&] { return inner_->recv(tensor, src, tag); });
}
WorkHandle RecordingGroup::barrier() {
  return record("barrier", nullptr, -1, [&] { return inner_->barrier(); });
}
WorkHandle RecordingGroup::all_to_all(at::Tensor& output, const at::Tensor& input,
                                      std::vector<int64_t> output_split_sizes,
                                      std::vector<int64_t> input_split_sizes) {
  return record("all_to_all", &input, -1, [&] {
    return inner_->all_to_all(output, input, std::move(output_split_sizes), std::move(input_split_sizes));
  });
}
WorkHandle RecordingGroup::reduce(at::Tensor& tensor, int root, ReduceOp op) {
  return record("reduce", &tensor, root, [&] { return inner_->reduce(tensor, root, op); });
}
WorkHandle RecordingGroup::gather(at::Tensor& output, const at::Tensor& input, int root) {
  return record("gather", &input, root, [&] { return inner_->gather(output, input, root); });
}
WorkHandle RecordingGroup::scatter(at::Tensor& output, const at::Tensor& input, int root) {
  return record("scatter", &output, root, [&] { return inner_->scatter(output, input, root); });
}
WorkHandle RecordingGroup::all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                                             const std::vector<int64_t>& counts) {
  return record("all_gather_uneven", &input, -1, [&] { return inner_->all_gather_uneven(output, input, counts); });
}

std::shared_ptr<ProcessGroup> RecordingGroup::new_subgroup(const std::vector<int>& ranks) {
  // Creating a group is collective (every member of this group takes part),
  // so it is recorded as an op of this group: a rank stuck in it shows up.
  const uint64_t ticket = recorder_->begin(id_, "new_subgroup", nullptr, -1);
  std::shared_ptr<ProcessGroup> sub;
  try {
    sub = inner_->new_subgroup(ranks);
  } catch (...) {
    recorder_->finish(ticket, RecordState::kFailed, -1);
    throw;
  }
  recorder_->finish(ticket, RecordState::kDone, FlightRecorder::now_us());
  if (!sub) return nullptr;
  RecordingOptions options = options_;
  options.name = "group";
  return std::make_shared<RecordingGroup>(std::move(sub), recorder_, options);
}

std::shared_ptr<ProcessGroup> record_collectives(std::shared_ptr<ProcessGroup> group,
                                                 std::shared_ptr<FlightRecorder> recorder,
                                                 RecordingOptions options) {
  return std::make_shared<RecordingGroup>(std::move(group), std::move(recorder), std::move(options));
}

void name_group(ProcessGroup& group, const std::string& name) {
  if (auto* g = dynamic_cast<RecordingGroup*>(&group)) g->recorder().rename_group(g->group_id(), name);
}

std::shared_ptr<FlightRecorder> recorder_of(ProcessGroup& group) {
  auto* g = dynamic_cast<RecordingGroup*>(&group);
  return g ? g->shared_recorder() : nullptr;
}

}  // namespace paratrain::comm

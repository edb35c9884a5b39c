// RecordingGroup: a ProcessGroup decorator that records every collective in
// a FlightRecorder (flight_recorder.h) and forwards it to the real group.
// Wrapping here, above the backends, covers Gloo, shm and MPI alike, and every
// strategy: init_process_group wraps the world group, and sub-groups made by
// new_subgroup (the device mesh's dp/tp/pp/cp groups) come back wrapped too.
// Not here: dumping on signals (doctor_watchdog.h), analysis (comm/doctor/dump_reader.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

/// What a RecordingGroup needs beyond its inner group.
struct RecordingOptions {
  /// The group's name in reports: "world", or an axis ("dp", "tp") set later with name_group().
  std::string name = "world";
  /// What Work::wait() without an argument waits for: the inner group's timeout (Work hides it).
  std::chrono::milliseconds timeout = kDefaultTimeout;
  /// Dump the recorder (FlightRecorder::dump) when a wait times out, before
  /// rethrowing: the moment a hang turns into an error is the moment its
  /// state is worth keeping.
  bool dump_on_timeout = true;
};

/// Records, then forwards. Every member issues the same collectives in the
/// same order, so a group's sequence numbers match across ranks: that is what
/// lets the doctor say which rank is behind.
class RecordingGroup : public ProcessGroup {
 public:
  /// `inner` does the work; `recorder` belongs to this rank (shared by all its groups).
  RecordingGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<FlightRecorder> recorder,
                 RecordingOptions options);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  const std::vector<int>& global_ranks() const override { return inner_->global_ranks(); }
  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override;
  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override;
  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  WorkHandle broadcast(at::Tensor& tensor, int root) override;
  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override;
  WorkHandle recv(at::Tensor& tensor, int src, int tag) override;
  WorkHandle barrier() override;
  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override;
  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override;
  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override;
  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override;
  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override;
  void abort() override { inner_->abort(); }
  at::Tensor allocate_symmetric(int64_t numel, at::ScalarType dtype) override {
    return inner_->allocate_symmetric(numel, dtype);
  }
  /// The inner group's sub-group, wrapped with the same recorder (named "group" until name_group()).
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override;

  FlightRecorder& recorder() const { return *recorder_; }  ///< this rank's recorder
  const std::shared_ptr<FlightRecorder>& shared_recorder() const { return recorder_; }  ///< the same, shared
  int group_id() const { return id_; }                      ///< this group's id in the recorder
  ProcessGroup& inner() const { return *inner_; }           ///< the group doing the work

 private:
  template <class Issue>
  WorkHandle record(const char* op, const at::Tensor* tensor, int peer, Issue&& issue);

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  RecordingOptions options_;
  int id_;
};

/// Wraps `group` so that every collective on it (and on its sub-groups) is
/// recorded in `recorder`.
std::shared_ptr<ProcessGroup> record_collectives(std::shared_ptr<ProcessGroup> group,
                                                 std::shared_ptr<FlightRecorder> recorder,
                                                 RecordingOptions options = {});

/// Names `group` in the doctor's reports ("dp", "tp", ...) when it records;
/// does nothing otherwise.
void name_group(ProcessGroup& group, const std::string& name);

/// Seconds this thread has spent inside collectives of recording groups
/// (issuing them and waiting for them; nested ones counted once) since it
/// started. A rank's step minus this is its own compute: what speed-weighted
/// batch shares measure (train/loop/batch_shares.h).
double thread_collective_seconds();

/// The recorder of `group`, or null when it does not record.
std::shared_ptr<FlightRecorder> recorder_of(ProcessGroup& group);

}  // namespace paratrain::comm

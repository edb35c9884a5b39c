// LibTorch's operator profiler, started and stopped around a range of steps
// (profile.*): the operators, autograd functions and user scopes (the step
// phases of core/phase.h) each thread of this rank ran, and on CUDA builds
// the GPU kernels and memory copies. Which profiler ran is part of the
// result: "kineto" (torch::autograd::profiler::enableProfiler, what
// torch.profiler uses; LibTorch collects CPU operators with it even where
// libkineto is absent) or "legacy" (enableProfilerLegacy), taken when the
// first throws or PARATRAIN_PROFILER=legacy asks for it.
//
// The profiler is thread-local: it sees the thread that starts it and the
// threads that inherit its state (autograd's, intra-op pools), so several
// ranks run as threads of one process each see their own operators.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::profile {

/// One recorded event, on the system clock (microseconds since the epoch).
struct OpEvent {
  std::string name;      ///< "aten::addmm", "forward" (a phase), "[memory]", a GPU kernel's name
  int64_t start_us = 0;  ///< when it began
  int64_t dur_us = 0;    ///< how long it ran (0 for memory events)
  uint64_t thread = 0;   ///< the profiler's thread id (not the OS's): the same for one thread's events
  bool user_scope = false;  ///< a RecordFunction user scope: a phase (core/phase.h) or the program's own
  bool gpu = false;         ///< a GPU kernel or memory copy (CUDA builds)
  int64_t stream = 0;       ///< GPU: the stream; CPU: 0
  int64_t bytes = 0;        ///< memory events: allocated (> 0) or freed (< 0) bytes
  std::string shapes;       ///< input shapes when profile.record_shapes, e.g. "[[64, 784], [256, 784]]"
};

/// What to record besides operator times.
struct OpProfilerOptions {
  bool record_shapes = false;  ///< input shapes of each operator (profile.record_shapes)
  bool memory = false;         ///< allocations and frees (profile.memory)
  bool cuda = false;           ///< GPU kernels and copies too (needs a CUDA build and a GPU)
};

/// One profiling session of this thread.
class OpProfiler {
 public:
  /// Starts the profiler on this thread. Throws paratrain::Error when neither
  /// profiler can start (another one already runs on this thread).
  explicit OpProfiler(OpProfilerOptions options);
  /// Stops it if still running (the events are dropped).
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  /// Stops and returns the events, sorted by start time.
  std::vector<OpEvent> stop();
  /// "kineto" or "legacy": which profiler runs.
  const std::string& kind() const { return kind_; }

 private:
  OpProfilerOptions options_;
  std::string kind_;
  bool running_ = false;
  int64_t legacy_offset_us_ = 0;  // legacy: its clock -> the system clock
};

/// The system clock in microseconds since the epoch (what OpEvent uses).
int64_t system_now_us();

}  // namespace paratrain::profile

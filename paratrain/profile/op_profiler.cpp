// OpProfiler: see op_profiler.h.
#include "paratrain/profile/op_profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <fmt/format.h>

#include "paratrain/core/compat.h"
#include "paratrain/core/error.h"
#include <spdlog/spdlog.h>

namespace paratrain::profile {
namespace {

namespace tpi = torch::profiler::impl;
namespace tap = torch::autograd::profiler;

std::string format_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  std::string out = "[";
  for (size_t i = 0; i < shapes.size(); ++i) out += (i ? ", " : "") + fmt::format("[{}]", fmt::join(shapes[i], ", "));
  return out + "]";
}

tpi::ProfilerConfig config_of(const OpProfilerOptions& o, tpi::ProfilerState state) {
  return tpi::ProfilerConfig(state, o.record_shapes, o.memory);
}

bool legacy_requested() {
  const char* env = std::getenv("PARATRAIN_PROFILER");
  return env && std::string_view(env) == "legacy";
}

// KinetoEvent's clock moved from microseconds to nanoseconds in LibTorch 2.1.
int64_t start_us(const tap::KinetoEvent& e) {
#if PARATRAIN_TORCH_AT_LEAST(2, 1)
  return static_cast<int64_t>(e.startNs() / 1000);
#else
  return static_cast<int64_t>(e.startUs());
#endif
}
int64_t duration_us(const tap::KinetoEvent& e) {
#if PARATRAIN_TORCH_AT_LEAST(2, 1)
  return static_cast<int64_t>(e.durationNs() / 1000);
#else
  return static_cast<int64_t>(e.durationUs());
#endif
}

OpEvent from_kineto(const tap::KinetoEvent& e, const OpProfilerOptions& options) {
  OpEvent out;
  out.name = e.name();
  out.start_us = start_us(e);
  out.dur_us = duration_us(e);
  out.thread = e.startThreadId();
  out.user_scope = e.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
  out.gpu = e.deviceType() == c10::DeviceType::CUDA;
  if (out.gpu) out.stream = e.deviceResourceId();
  out.bytes = e.nBytes();
  if (options.record_shapes && e.hasShapes()) {
    const auto shapes = e.shapes();
    out.shapes = format_shapes(std::vector<std::vector<int64_t>>(shapes.begin(), shapes.end()));
  }
  return out;
}

// The legacy profiler gives push/pop pairs per thread; a pop closes the
// newest open push of its thread.
std::vector<OpEvent> from_legacy(const tap::thread_event_lists& lists, int64_t offset_us,
                                 const OpProfilerOptions& options) {
  std::vector<OpEvent> out;
  for (const auto& list : lists) {
    std::vector<const tap::LegacyEvent*> open;
    for (const auto& e : list) {
      const std::string kind = e.kindStr();
      if (kind == "push") {
        open.push_back(&e);
      } else if (kind == "pop" && !open.empty()) {
        const tap::LegacyEvent& begin = *open.back();
        open.pop_back();
        OpEvent op;
        op.name = begin.name();
        op.start_us = static_cast<int64_t>(begin.cpuUs()) + offset_us;
        op.dur_us = static_cast<int64_t>(begin.cpuElapsedUs(e));
        op.thread = begin.threadId();
        op.user_scope = begin.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
        if (options.record_shapes) op.shapes = format_shapes(begin.shapes());
        out.push_back(std::move(op));
      } else if (kind == "memory_alloc" && options.memory) {
        OpEvent mem;
        mem.name = "[memory]";
        mem.start_us = static_cast<int64_t>(e.cpuUs()) + offset_us;
        mem.thread = e.threadId();
        mem.bytes = e.cpuMemoryUsage();
        out.push_back(std::move(mem));
      }
    }
  }
  return out;
}

}  // namespace

int64_t system_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

OpProfiler::OpProfiler(OpProfilerOptions options) : options_(options) {
  std::string kineto_error;
  if (!legacy_requested()) {
    try {
      std::set<tpi::ActivityType> activities{tpi::ActivityType::CPU};
      if (options_.cuda) activities.insert(tpi::ActivityType::CUDA);
      tap::prepareProfiler(config_of(options_, tpi::ProfilerState::KINETO), activities);
      tap::enableProfiler(config_of(options_, tpi::ProfilerState::KINETO), activities);
      kind_ = "kineto";
      running_ = true;
      return;
    } catch (const std::exception& e) {
      kineto_error = e.what();
    }
  }
  try {
    tap::enableProfilerLegacy(config_of(options_, tpi::ProfilerState::CPU));
  } catch (const std::exception& e) {
    throw Error(fmt::format("the operator profiler could not start (kineto: {}; legacy: {}); is another profiler "
                            "running on this thread?",
                            kineto_error.empty() ? "not tried, PARATRAIN_PROFILER=legacy" : kineto_error, e.what()));
  }
  if (!kineto_error.empty()) spdlog::warn("profile: the kineto profiler failed ({}); using the legacy one", kineto_error);
  kind_ = "legacy";
  running_ = true;
  // The legacy clock is LibTorch's own: anchored to the system clock here,
  // at its "__start_profile" mark (a few microseconds apart).
  legacy_offset_us_ = system_now_us();
}

OpProfiler::~OpProfiler() {
  if (!running_) return;
  try {
    (void)stop();
  } catch (...) {  // a destructor never throws; the events were not wanted
  }
}

std::vector<OpEvent> OpProfiler::stop() {
  if (!running_) throw Error("OpProfiler::stop: the profiler is not running");
  running_ = false;
  std::vector<OpEvent> events;
  if (kind_ == "kineto") {
    const auto result = tap::disableProfiler();
    for (const auto& e : result->events()) {
      OpEvent op = from_kineto(e, options_);
      if (op.name == "[memory]" && !options_.memory) continue;
      events.push_back(std::move(op));
    }
  } else {
    const auto lists = tap::disableProfilerLegacy();
    int64_t start_mark_us = 0;
    for (const auto& list : lists)
      for (const auto& e : list)
        if (e.kindStr() == "mark" && std::string_view(e.name()) == "__start_profile")
          start_mark_us = static_cast<int64_t>(e.cpuUs());
    events = from_legacy(lists, legacy_offset_us_ - start_mark_us, options_);
  }
  // An operator and its first callee often start in the same microsecond:
  // the longer one (the caller) first, so nesting stays right.
  std::stable_sort(events.begin(), events.end(), [](const OpEvent& a, const OpEvent& b) {
    return a.start_us != b.start_us ? a.start_us < b.start_us : a.dur_us > b.dur_us;
  });
  return events;
}

}  // namespace paratrain::profile

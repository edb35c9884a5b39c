// StepRecorder: see step_recorder.h.
#include "paratrain/profile/step_recorder.h"

#include <algorithm>
#include <map>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/core/phase.h"
#include "paratrain/core/process_state.h"

namespace paratrain::profile {
namespace {

// Bytes per element of the dtype names the flight recorder keeps
// (c10::toString of a ScalarType); 4 when unknown.
int64_t element_size(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {
      {"Float", 4}, {"Double", 8}, {"Half", 2},  {"BFloat16", 2}, {"Long", 8},
      {"Int", 4},   {"Short", 2},  {"Byte", 1},  {"Char", 1},     {"Bool", 1}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 4 : it->second;
}

}  // namespace

StepRecorder::StepRecorder(StepRecorderOptions options) : options_(std::move(options)) {
  profile_.rank = options_.rank;
  profile_.world_size = options_.world_size;
  profile_.host = host_name();
  // The steady-to-system offset as of now: the two clocks drift apart (NTP
  // slews the system clock) between the run's start and a late range.
  options_.clock.steady_to_system_us = system_now_us() - comm::FlightRecorder::now_us();
  profile_.clock = options_.clock;
  profile_.collectives_source = options_.recorder ? "flight recorder" : options_.no_recorder_reason;
  if (options_.recorder) {
    // Only what is issued from here on.
    const auto records = options_.recorder->records();
    next_record_ = records.empty() ? 0 : records.back().index + 1;
  }
  ops_ = std::make_unique<OpProfiler>(options_.ops);
  profile_.profiler = ops_->kind();
}

StepRecorder::~StepRecorder() = default;

int64_t StepRecorder::now() const { return system_now_us() + options_.clock.offset_us; }

void StepRecorder::begin_step(int64_t step) { open_ = StepSpan{step, now(), 0}; }

void StepRecorder::end_step(int64_t step) {
  const int64_t t = now();
  if (open_ && open_->step == step) {
    open_->end_us = t;
    profile_.steps.push_back(*open_);
  }
  open_.reset();
  harvest(t);
}

void StepRecorder::harvest(int64_t now_us) {
  if (!options_.recorder) return;
  const auto groups = options_.recorder->groups();
  const int64_t shift = options_.clock.steady_to_system_us + options_.clock.offset_us;
  for (const comm::CollectiveRecord& r : options_.recorder->records()) {
    if (r.index < next_record_) continue;
    if (r.index > next_record_) profile_.dropped_collectives += static_cast<int64_t>(r.index - next_record_);
    next_record_ = r.index + 1;
    CommEvent c;
    c.op = r.op;
    c.group = r.group >= 0 && r.group < static_cast<int>(groups.size()) ? groups[r.group].name : "group";
    c.seq = r.seq;
    c.dtype = r.dtype;
    c.bytes = r.numel * element_size(c.dtype);
    c.peer = r.peer;
    c.start_us = r.start_us + shift;
    c.end_us = r.end_us >= 0 ? r.end_us + shift : now_us;
    c.state = comm::to_string(r.state);
    profile_.collectives.push_back(std::move(c));
  }
}

RankProfile StepRecorder::finish(ProfileOverhead overhead) {
  auto events = ops_->stop();
  for (auto& e : events) e.start_us += options_.clock.offset_us;
  // The loop's thread is the one that ran the optimizer phase (or any phase).
  for (const char* name : {kPhaseOptimizer, kPhaseData, kPhaseForward}) {
    const auto it = std::find_if(events.begin(), events.end(),
                                 [&](const OpEvent& e) { return e.user_scope && e.name == name; });
    if (it != events.end()) {
      profile_.loop_thread = it->thread;
      break;
    }
  }
  harvest(now());
  std::sort(profile_.collectives.begin(), profile_.collectives.end(),
            [](const CommEvent& a, const CommEvent& b) { return a.start_us < b.start_us; });
  profile_.events = std::move(events);
  profile_.overhead = overhead;
  return std::move(profile_);
}

}  // namespace paratrain::profile

// Chrome trace writer: rank timelines -> Trace Event Format JSON (complete
// events ph "X" with ts/dur in microseconds, metadata events ph "M" naming
// the process and each rank's row). Reading the rank files is timeline.cpp.
#include "paratrain/pipeline/chrome_trace.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"

namespace paratrain::pipeline {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool in_range(int64_t step, const ChromeTraceOptions& options) {
  return (!options.first_step || step >= *options.first_step) && (!options.last_step || step <= *options.last_step);
}

std::string row_name(const TimelineHeader& h) {
  if (h.stage < 0 && h.dp < 0) return fmt::format("rank {}", h.rank);
  return fmt::format("rank {} (stage {}, dp {})", h.rank, h.stage, h.dp);
}

json metadata(const char* name, int tid, json args) {
  return json{{"ph", "M"}, {"name", name}, {"pid", 0}, {"tid", tid}, {"args", std::move(args)}};
}

std::string describe_range(const ChromeTraceOptions& options) {
  auto end = [](const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string(); };
  return end(options.first_step) + ":" + end(options.last_step);
}

}  // namespace

std::string chrome_event_name(const TimelineEvent& e) {
  const std::string mb = e.microbatch >= 0 ? std::to_string(e.microbatch) : std::string();
  const std::string chunk = e.chunk > 0 ? fmt::format(".c{}", e.chunk) : std::string();
  switch (e.kind) {
    case EventKind::kForward: return "F" + mb + chunk;
    case EventKind::kBackward: return "B" + mb + chunk;
    case EventKind::kRecompute: return "R" + mb + chunk;
    case EventKind::kSend: return e.peer >= 0 ? fmt::format("send→{}", e.peer) : "send";
    case EventKind::kRecv: return e.peer >= 0 ? fmt::format("recv←{}", e.peer) : "recv";
    case EventKind::kWait: return "wait";
    case EventKind::kOptimizer: return "optimizer";
  }
  return to_string(e.kind);
}

json chrome_trace_json(const std::vector<RankTimeline>& ranks, const ChromeTraceOptions& options) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& rank : ranks) {
    for (const auto& e : rank.events) {
      if (in_range(e.step, options)) origin = std::min(origin, e.start_us);
    }
  }
  json events = json::array();
  events.push_back(metadata("process_name", 0, {{"name", "pipeline"}}));
  for (const auto& rank : ranks) {
    events.push_back(metadata("thread_name", rank.header.rank, {{"name", row_name(rank.header)}}));
    // Rows sorted by rank rather than by first event (the viewers' default).
    events.push_back(metadata("thread_sort_index", rank.header.rank, {{"sort_index", rank.header.rank}}));
  }
  for (const auto& rank : ranks) {
    for (const auto& e : rank.events) {
      if (!in_range(e.step, options)) continue;
      json args{{"step", e.step}, {"microbatch", e.microbatch}, {"chunk", e.chunk}, {"bytes", e.bytes}};
      if (e.peer >= 0) args["peer"] = e.peer;
      events.push_back(json{{"name", chrome_event_name(e)},
                            {"cat", to_string(e.kind)},
                            {"ph", "X"},
                            {"ts", e.start_us - origin},
                            {"dur", e.end_us - e.start_us},
                            {"pid", 0},
                            {"tid", rank.header.rank},
                            {"args", std::move(args)}});
    }
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

int64_t write_chrome_trace(const fs::path& run_dir, const fs::path& out, const ChromeTraceOptions& options) {
  const auto ranks = read_run_timelines(run_dir);
  const json trace = chrome_trace_json(ranks, options);
  const auto complete = std::count_if(trace["traceEvents"].begin(), trace["traceEvents"].end(),
                                      [](const json& e) { return e["ph"] == "X"; });
  if (complete == 0) {
    std::vector<std::vector<TimelineEvent>> per_rank;
    for (const auto& r : ranks) per_rank.push_back(r.events);
    const auto steps = recorded_steps(per_rank);
    throw Error(fmt::format("no timeline event of {} falls in steps {}; recorded steps: {}", run_dir.string(),
                            describe_range(options),
                            steps.empty() ? std::string("none") : fmt::format("{}..{}", steps.front(), steps.back())));
  }
  // No fsync: a trace is regenerated from the rank files if a power loss eats it.
  write_file_atomically(out, trace.dump() + "\n", {.sync = false});
  return complete;
}

}  // namespace paratrain::pipeline

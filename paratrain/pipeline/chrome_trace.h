// The rank timelines of a run (timeline.h) as one Chrome trace JSON, the
// "Trace Event Format" that chrome://tracing and https://ui.perfetto.dev open:
// one row per rank, so the pipeline bubble is visible. Conversion only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/pipeline/timeline.h"

namespace paratrain::pipeline {

struct ChromeTraceOptions {
  // Steps to include, both ends inclusive; unset = from the first / to the
  // last recorded step. Fewer steps keep the viewer fast and the eye on the
  // steady state (the first step includes warm-up).
  std::optional<int64_t> first_step, last_step;
};

// Reads every <run_dir>/trace/rank_<r>.jsonl and writes `out` (through a
// temporary file and a rename, so a viewer never opens half a file). Rows:
// pid 0 "pipeline", tid = rank named "rank r (stage s, dp d)"; events "F3",
// "B3", "R3" (".c1" appended for chunk > 0), "send→1", "recv←0", "wait",
// "optimizer", with args {step, microbatch, chunk, bytes}; timestamps in
// microseconds shifted so the earliest event is at 0. Returns the number of
// complete ("X") events written. Throws Error when the run has no trace files
// (saying how to get them) or no event falls in the chosen steps.
int64_t write_chrome_trace(const std::filesystem::path& run_dir, const std::filesystem::path& out,
                           const ChromeTraceOptions& options = {});

// The trace document itself, for callers that already hold the timelines
// (the benchmark, tests). Same rows and names as write_chrome_trace.
nlohmann::json chrome_trace_json(const std::vector<RankTimeline>& ranks, const ChromeTraceOptions& options = {});

// "F3", "B3.c1", "send→1", ...: the name an event gets in the trace.
std::string chrome_event_name(const TimelineEvent& e);

}  // namespace paratrain::pipeline

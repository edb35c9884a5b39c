// Every profiled rank on one timeline, as a Chrome trace (the Trace Event
// Format that chrome://tracing and ui.perfetto.dev open): a process per
// rank, with threads for the training loop (phases, and the operators
// inside them), LibTorch's other threads, communication (a thread per
// group: each collective with its op, bytes, sequence number), GPU streams,
// the optimizer steps, and a counter of allocated memory (profile.memory).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/profile/rank_profile.h"

namespace paratrain::profile {

/// The trace document: {"traceEvents": [...], "displayTimeUnit": "ms",
/// "otherData": {...}}; times relative to the earliest profiled step.
nlohmann::json chrome_trace(const std::vector<RankProfile>& ranks);

/// "" when `trace` follows the Trace Event Format's JSON object form (a
/// "traceEvents" array of events, each with a string name, a known phase,
/// integer pid/tid, numeric ts, a non-negative dur on complete events, and
/// object args), else the first violation.
std::string trace_event_format_problem(const nlohmann::json& trace);

}  // namespace paratrain::profile

// `paratrain trace RUN_DIR [-o trace.json] [--steps A:B]`: turns a run's
// per-rank recordings into one Chrome trace (chrome://tracing, Perfetto).
// A profiled run (profile.steps, RUN_DIR/profile/) gives every profiled rank
// on one clock: phases, operators, collectives, and the pipeline's actions
// when it has them. A pipeline run without a profile gives its per-rank
// timelines, as before; either way a pipeline run's measured bubble per step
// is printed. Parsing and printing only; the work is paratrain/profile/ and
// paratrain/pipeline/chrome_trace.h, timeline.h.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"
#include "paratrain/profile/chrome_trace.h"
#include "paratrain/profile/rank_profile.h"
#include "paratrain/train/run/run_dir.h"
#include "paratrain/pipeline/chrome_trace.h"
#include "paratrain/pipeline/timeline.h"

namespace paratrain::cli {

namespace {

// "A:B", "A:", ":B" or "A" (both ends inclusive) -> the options; nullopt
// when the text is none of those.
std::optional<pipeline::ChromeTraceOptions> parse_steps(const std::string& text) {
  auto number = [](const std::string& s) -> std::optional<int64_t> {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 18) return std::nullopt;
    return std::stoll(s);
  };
  pipeline::ChromeTraceOptions options;
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    options.first_step = options.last_step = number(text);
    if (!options.first_step) return std::nullopt;
    return options;
  }
  const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
  if (!a.empty() && !(options.first_step = number(a))) return std::nullopt;
  if (!b.empty() && !(options.last_step = number(b))) return std::nullopt;
  if (options.first_step && options.last_step && *options.first_step > *options.last_step) return std::nullopt;
  return options;
}

// The pipeline's actions of each profiled rank as a thread of its process,
// shifted from the steady clock onto the profile's timeline; only what falls
// inside the rank's profiled steps.
int64_t add_pipeline_actions(nlohmann::json& trace, const std::vector<profile::RankProfile>& profiles,
                             const std::vector<pipeline::RankTimeline>& timelines) {
  constexpr int64_t kPipelineTid = 30000;
  const int64_t origin = trace["otherData"]["origin_unix_us"].get<int64_t>();
  int64_t added = 0;
  for (const auto& t : timelines) {
    const auto p = std::find_if(profiles.begin(), profiles.end(),
                                [&](const profile::RankProfile& r) { return r.rank == t.header.rank; });
    if (p == profiles.end() || p->steps.empty()) continue;
    const int64_t shift = p->clock.steady_to_system_us + p->clock.offset_us;
    const int64_t first = p->steps.front().start_us, last = p->steps.back().end_us;
    auto& events = trace["traceEvents"];
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", p->rank}, {"tid", kPipelineTid},
                      {"args", {{"name", "pipeline actions"}}}});
    for (const auto& e : t.events) {
      const int64_t start = e.start_us + shift, end = e.end_us + shift;
      if (end < first || start > last) continue;
      events.push_back({{"name", pipeline::chrome_event_name(e)}, {"ph", "X"}, {"pid", p->rank},
                        {"tid", kPipelineTid}, {"ts", start - origin}, {"dur", std::max<int64_t>(0, end - start)},
                        {"cat", "pipeline"},
                        {"args", {{"step", e.step}, {"microbatch", e.microbatch}, {"chunk", e.chunk}, {"bytes", e.bytes}}}});
      ++added;
    }
  }
  return added;
}

// A profiled run: one trace of every profiled rank (and its pipeline actions).
int write_profile_trace(const std::string& run_dir, const std::string& out) {
  const auto profiles = profile::read_run_profiles(run_dir);
  nlohmann::json trace = profile::chrome_trace(profiles);
  std::vector<pipeline::RankTimeline> timelines;
  try {
    timelines = pipeline::read_run_timelines(run_dir);
  } catch (const std::exception&) {
    // Not a pipeline run (or its timelines are gone): the profile alone.
  }
  const int64_t actions = timelines.empty() ? 0 : add_pipeline_actions(trace, profiles, timelines);
  write_file_atomically(out, trace.dump());
  std::printf("wrote %s: %zu events from %zu profiled ranks%s (open it in ui.perfetto.dev or chrome://tracing)\n",
              out.c_str(), trace["traceEvents"].size(), profiles.size(),
              actions ? (", " + std::to_string(actions) + " pipeline actions").c_str() : "");
  for (const auto& p : profiles)
    std::printf("rank %d: steps %lld-%lld, %s profiler, clock %s (skew %lld us)\n", p.rank,
                static_cast<long long>(p.steps.empty() ? 0 : p.steps.front().step),
                static_cast<long long>(p.steps.empty() ? 0 : p.steps.back().step), p.profiler.c_str(),
                p.clock.method.c_str(), static_cast<long long>(p.clock.skew_us));
  std::printf("where the time went: paratrain profile %s\n", run_dir.c_str());
  return 0;
}

// A profile with at least one rank file (an empty folder falls back to the timelines).
bool has_profile(const std::string& run_dir) {
  try {
    return !profile::read_run_profiles(run_dir).empty();
  } catch (const ConfigError&) {
    return false;
  }
}

std::vector<pipeline::RankTimeline> timelines_of(const std::string& run_dir) {
  try {
    return pipeline::read_run_timelines(run_dir);
  } catch (const std::exception&) {
    return {};
  }
}

// The measured pipeline bubble of each recorded step (within --steps).
void print_bubbles(const std::string& run_dir, const pipeline::ChromeTraceOptions& options) {
  const auto ranks = timelines_of(run_dir);
  std::vector<std::vector<pipeline::TimelineEvent>> per_rank;
  std::vector<int> rank_ids;
  for (const auto& r : ranks) {
    per_rank.push_back(r.events);
    rank_ids.push_back(r.header.rank);
  }
  std::vector<pipeline::BubbleReport> reports;
  for (int64_t step : pipeline::recorded_steps(per_rank)) {
    if (options.first_step && step < *options.first_step) continue;
    if (options.last_step && step > *options.last_step) continue;
    reports.push_back(pipeline::measure_bubble(per_rank, step));
  }
  std::printf("measured bubble (1 - time in forward/backward/recompute / step span, mean over ranks):\n");
  std::fputs(pipeline::format_bubbles(reports, rank_ids).c_str(), stdout);
}

}  // namespace

Command add_trace_command(CLI::App& app) {
  struct Args {
    std::string run_dir;
    std::string output;
    std::string steps;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "trace",
      "Write a run's recordings as one Chrome trace JSON for ui.perfetto.dev or chrome://tracing: a profiled run "
      "(profile.steps; RUN_DIR/profile/) gives every profiled rank on one clock with its phases, operators, "
      "collectives and pipeline actions; a pipeline run without a profile gives its per-rank timelines "
      "(RUN_DIR/trace/rank_<r>.jsonl, pipeline.trace_steps > 0) and prints the measured bubble per step");
  sub->add_option("run_dir", args->run_dir, "the run directory, e.g. runs/job")->required();
  sub->add_option("-o,--output", args->output, "the trace file to write (default: RUN_DIR/trace.json)");
  sub->add_option("--steps", args->steps, "pipeline timelines: steps to include, both ends inclusive: 3:5, 3:, :5 or 4 (default: all; a profile holds its profile.steps)")
      ->check([](const std::string& text) -> std::string {
        return parse_steps(text) ? std::string() : "expected A:B, A:, :B or A with 0 <= A <= B, got '" + text + "'";
      });

  auto run = [args]() -> int {
    args->run_dir = train::resolve_run_dir(args->run_dir).string();  // runs/<name>: its newest version
    const auto options = args->steps.empty() ? pipeline::ChromeTraceOptions{} : *parse_steps(args->steps);
    const std::string out = args->output.empty() ? args->run_dir + "/trace.json" : args->output;
    if (has_profile(args->run_dir)) {
      write_profile_trace(args->run_dir, out);
      // A profiled pipeline run still gets its bubble per step.
      if (!timelines_of(args->run_dir).empty()) print_bubbles(args->run_dir, options);
      return 0;
    }
    int64_t count = 0;
    try {
      count = pipeline::write_chrome_trace(args->run_dir, out, options);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + "; or profile any run with --set profile.steps=A-B (RUN_DIR/profile/)");
    }
    std::printf("wrote %s: %lld events from %zu ranks (open it in chrome://tracing or ui.perfetto.dev)\n",
                out.c_str(), static_cast<long long>(count), timelines_of(args->run_dir).size());
    print_bubbles(args->run_dir, options);
    return 0;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

// `paratrain trace RUN_DIR [-o trace.json] [--steps A:B]`: turns a pipeline
// run's per-rank timelines into one Chrome trace (chrome://tracing, Perfetto)
// and prints the measured bubble per step. Parsing and printing only; the
// work is paratrain/pipeline/chrome_trace.h and timeline.h.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
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
      "Write a pipeline run's per-rank timelines (RUN_DIR/trace/rank_<r>.jsonl, recorded when "
      "pipeline.trace_steps > 0) as one Chrome trace JSON for chrome://tracing or ui.perfetto.dev, and print the "
      "measured pipeline bubble per step");
  sub->add_option("run_dir", args->run_dir, "the run directory, e.g. runs/job")->required();
  sub->add_option("-o,--output", args->output, "the trace file to write (default: RUN_DIR/trace.json)");
  sub->add_option("--steps", args->steps, "steps to include, both ends inclusive: 3:5, 3:, :5 or 4 (default: all)")
      ->check([](const std::string& text) -> std::string {
        return parse_steps(text) ? std::string() : "expected A:B, A:, :B or A with 0 <= A <= B, got '" + text + "'";
      });

  auto run = [args]() -> int {
    args->run_dir = train::resolve_run_dir(args->run_dir).string();  // runs/<name>: its newest version
    const auto options = args->steps.empty() ? pipeline::ChromeTraceOptions{} : *parse_steps(args->steps);
    const std::string out = args->output.empty() ? args->run_dir + "/trace.json" : args->output;
    const int64_t count = pipeline::write_chrome_trace(args->run_dir, out, options);

    const auto ranks = pipeline::read_run_timelines(args->run_dir);
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
    std::printf("wrote %s: %lld events from %zu ranks (open it in chrome://tracing or ui.perfetto.dev)\n",
                out.c_str(), static_cast<long long>(count), ranks.size());
    std::printf("measured bubble (1 - time in forward/backward/recompute / step span, mean over ranks):\n");
    std::fputs(pipeline::format_bubbles(reports, rank_ids).c_str(), stdout);
    return 0;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

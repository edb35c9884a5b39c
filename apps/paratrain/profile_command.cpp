// `paratrain profile RUN_DIR [--json] [--top N]`: where each profiled step's
// time went on every profiled rank (data, compute, optimizer, exposed and
// overlapped communication, idle), the operators with the most self time,
// and the straggler of each step. Parsing and printing only; the work is
// paratrain/profile/summary.h.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/profile/rank_profile.h"
#include "paratrain/profile/summary.h"
#include "paratrain/train/run/run_dir.h"

namespace paratrain::cli {

Command add_profile_command(CLI::App& app) {
  struct Args {
    std::string run_dir;
    bool json = false;
    int top = 15;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "profile",
      "Summarize a profiled run (profile.steps; RUN_DIR/profile/rank_<r>.json): per rank and step the "
      "milliseconds of data loading, compute, optimizer, exposed and overlapped communication and idle time, the "
      "top operators by self time, and each step's straggler. `paratrain trace RUN_DIR` draws the same timeline");
  sub->add_option("run_dir", args->run_dir, "the run directory, e.g. runs/job (its newest version)")->required();
  sub->add_flag("--json", args->json, "print the summary as JSON (for scripts)");
  sub->add_option("--top", args->top, "operators to list")->check(CLI::Range(1, 1000))->capture_default_str();
  auto run = [args]() -> int {
    const auto dir = train::resolve_run_dir(args->run_dir);
    const auto summary = profile::summarize(profile::read_run_profiles(dir), args->top);
    if (args->json) std::printf("%s\n", profile::summary_json(summary).dump(2).c_str());
    else std::fputs(profile::format_summary(summary).c_str(), stdout);
    return 0;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

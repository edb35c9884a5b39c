// `paratrain runs [DIR]`: lists the runs under DIR (default runs/), one row
// per version, from train/run/run_list.h.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include "apps/paratrain/commands.h"
#include "paratrain/core/error.h"
#include "paratrain/train/run/run_list.h"

namespace paratrain::cli {

Command add_runs_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>("runs");
  auto* sub = app.add_subcommand(
      "runs", "List the runs under DIR (default: runs): name, version, status, steps, checkpoints, best evaluation");
  sub->add_option("dir", *dir, "the folder that holds the runs (run.output_dir)");
  auto run = [dir]() -> int {
    // A mistyped folder must not look like an empty one ("no runs", exit 0).
    std::error_code ec;
    const auto status = std::filesystem::status(*dir, ec);
    if (!std::filesystem::is_directory(status)) {
      throw ConfigError(fmt::format(
          "paratrain runs: '{}' {} (current directory: {}): give the folder that holds the runs (run.output_dir)",
          *dir, std::filesystem::exists(status) ? "is not a folder" : "does not exist",
          std::filesystem::current_path(ec).string()));
    }
    std::fputs(train::format_runs(train::list_runs(*dir)).c_str(), stdout);
    return 0;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

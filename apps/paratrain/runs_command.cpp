// `paratrain runs [DIR]`: lists the runs under DIR (default runs/), one row
// per version, from train/run_list.h.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/train/run_list.h"

namespace paratrain::cli {

Command add_runs_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>("runs");
  auto* sub = app.add_subcommand(
      "runs", "List the runs under DIR (default: runs): name, version, status, steps, checkpoints, best evaluation");
  sub->add_option("dir", *dir, "the folder that holds the runs (run.output_dir)");
  auto run = [dir]() -> int {
    std::fputs(train::format_runs(train::list_runs(*dir)).c_str(), stdout);
    return 0;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

// `paratrain plot RUN_DIR... [-o DIR]`: accuracy and loss curves of several
// runs on one chart each (PNG, drawn by gnuplot). The data files and the
// gnuplot script are paratrain/train/run/plots.h's; this file runs gnuplot.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/paratrain/commands.h"
#include "paratrain/core/error.h"
#include "paratrain/train/run/plots.h"

namespace paratrain::cli {

namespace {

// Runs `gnuplot plot.gp` inside `dir` (the script names files relative to
// it). fork/exec rather than system(): no shell parses the folder name.
void run_gnuplot(const std::filesystem::path& dir) {
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("cannot start gnuplot: fork failed");
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) _exit(126);
    ::execlp("gnuplot", "gnuplot", "plot.gp", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    throw Error(fmt::format("gnuplot is not installed: run scripts/install-deps.sh (or apt-get install "
                            "gnuplot-nox); the data and the script are in {}, `gnuplot plot.gp` there draws them",
                            dir.string()));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error(fmt::format("gnuplot failed on {}/plot.gp (see its message above)", dir.string()));
  }
}

}  // namespace

Command add_plot_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> runs;
    std::string output = "plots";
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "plot",
      "Draw test accuracy and loss of one or more runs against epochs and against samples seen (one line per run) "
      "as PNG files, from each RUN_DIR/metrics.jsonl (needs gnuplot)");
  sub->add_option("run_dirs", args->runs, "run directories, e.g. runs/a runs/b")->required();
  sub->add_option("-o,--output", args->output, "folder for the PNGs, data files and plot.gp (default: plots)");

  auto run = [args]() -> int {
    std::vector<train::RunSeries> runs;
    for (const auto& dir : args->runs) runs.push_back(train::read_run_series(dir));
    const auto files = train::write_plot_script(runs, args->output);
    run_gnuplot(args->output);
    for (const auto& png : files.pngs) std::printf("wrote %s\n", png.c_str());
    return 0;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

// `paratrain checkpoint consolidate|inspect CKPT` and `compare A B`: offline
// tools over checkpoints (sharded step directories or single files). Parsing
// only; the work is consolidate_checkpoint / describe_checkpoint in
// paratrain/checkpoint/sharded.h and compare_checkpoints in compare.h,
// errors go to main.cpp's handler.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/checkpoint/compare.h"
#include "paratrain/checkpoint/sharded.h"

namespace paratrain::cli {

Command add_checkpoint_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string output;
    std::string a, b;                  // compare
    checkpoint::CompareOptions compare;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("checkpoint", "Inspect, convert or compare checkpoints (step_N/ directories or files)");
  sub->require_subcommand(1);
  auto* consolidate = sub->add_subcommand(
      "consolidate",
      "Write a sharded checkpoint as one plain safetensors file (names model/<param>, "
      "optimizer/<param>/<state>), which load_checkpoint and Python's safetensors read");
  consolidate->add_option("checkpoint", args->checkpoint, "checkpoint directory, e.g. runs/job/checkpoints/step_00000100")
      ->required();
  consolidate->add_option("-o,--output", args->output, "the .safetensors file to write")->required();
  auto* inspect = sub->add_subcommand(
      "inspect",
      "Print a checkpoint's layout (step, files, tensors and their chunks) and verify every file's size and "
      "checksum; exit 1 when one is damaged");
  inspect->add_option("checkpoint", args->checkpoint, "checkpoint directory or file")->required();

  auto* compare = sub->add_subcommand(
      "compare",
      "Compare two checkpoints tensor by tensor (e.g. a consolidated multi-rank run against a 1-process run); "
      "exit 0 when they agree within --rtol, 1 when they differ");
  compare->add_option("a", args->a, "checkpoint directory or .safetensors file")->required();
  compare->add_option("b", args->b, "the reference: relative differences are taken against its values")->required();
  compare->add_option("--rtol", args->compare.rtol, "largest max|a-b| / max|b| per tensor that still agrees")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  compare->add_option("--prefix", args->compare.prefix, "compare only tensors whose names start with this")
      ->capture_default_str();
  compare->add_flag("--all", args->compare.all, "compare every tensor (model, optimizer state, rng), ignoring --prefix");

  auto run = [args, consolidate, inspect, compare]() -> int {
    if (consolidate->parsed()) {
      checkpoint::consolidate_checkpoint(args->checkpoint, args->output);
      std::printf("wrote %s\n", args->output.c_str());
      return 0;
    }
    if (inspect->parsed()) {
      std::fputs(checkpoint::describe_checkpoint(args->checkpoint).c_str(), stdout);
      const auto problems = checkpoint::verify_checkpoint_files(args->checkpoint);
      if (problems.empty()) {
        std::puts("  verified: every file has its recorded size and checksum");
        return 0;
      }
      std::fprintf(stderr, "paratrain: error: checkpoint %s is damaged; resume from another one:\n",
                   args->checkpoint.c_str());
      for (const auto& p : problems) std::fprintf(stderr, "  %s\n", p.c_str());
      return 1;
    }
    if (compare->parsed()) {
      const checkpoint::CompareReport report = checkpoint::compare_checkpoints(args->a, args->b, args->compare);
      std::fputs(report.format().c_str(), stdout);
      return report.ok() ? 0 : 1;
    }
    return 2;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

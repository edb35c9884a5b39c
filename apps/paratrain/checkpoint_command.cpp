// `paratrain checkpoint consolidate|inspect CKPT`: offline tools over a
// checkpoint (a sharded step directory or a single file). Parsing only; the
// work is consolidate_checkpoint / describe_checkpoint in
// paratrain/train/checkpoint/sharded.h, errors go to main.cpp's handler.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/train/checkpoint/sharded.h"

namespace paratrain::cli {

Command add_checkpoint_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string output;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("checkpoint", "Inspect or convert a checkpoint (a step_N/ directory or a file)");
  sub->require_subcommand(1);
  auto* consolidate = sub->add_subcommand(
      "consolidate",
      "Write a sharded checkpoint as one plain safetensors file (names model/<param>, "
      "optimizer/<param>/<state>), which load_checkpoint and Python's safetensors read");
  consolidate->add_option("checkpoint", args->checkpoint, "checkpoint directory, e.g. runs/job/checkpoints/step_00000100")
      ->required();
  consolidate->add_option("-o,--output", args->output, "the .safetensors file to write")->required();
  auto* inspect = sub->add_subcommand("inspect", "Print a checkpoint's layout: step, files, tensors and their chunks");
  inspect->add_option("checkpoint", args->checkpoint, "checkpoint directory or file")->required();

  auto run = [args, consolidate, inspect]() -> int {
    if (consolidate->parsed()) {
      train::consolidate_checkpoint(args->checkpoint, args->output);
      std::printf("wrote %s\n", args->output.c_str());
      return 0;
    }
    if (inspect->parsed()) {
      std::fputs(train::describe_checkpoint(args->checkpoint).c_str(), stdout);
      return 0;
    }
    return 2;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli

// `paratrain` CLI entry: dispatches to sub-commands (launch, train, federated, checkpoint, plan, trace, plot, generate, config, doctor, bench).
// The only place that turns an exception into an exit code.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/core/allocator.h"
#include "paratrain/core/error.h"

int main(int argc, char** argv) {
  paratrain::core::retain_freed_memory();  // see allocator.h: ~1.2x samples/s on CPU
  CLI::App app{"paratrain: distributed training for LibTorch"};
  app.require_subcommand(1);
  const paratrain::cli::Command commands[] = {
      paratrain::cli::add_launch_command(app),
      paratrain::cli::add_train_command(app),
      paratrain::cli::add_checkpoint_command(app),
      paratrain::cli::add_plan_command(app),
      paratrain::cli::add_trace_command(app),
      paratrain::cli::add_plot_command(app),
      paratrain::cli::add_generate_command(app),
      paratrain::cli::add_runs_command(app),
      paratrain::cli::add_config_command(app),
      paratrain::cli::add_federated_command(app),
      paratrain::cli::add_doctor_command(app),
      paratrain::cli::add_bench_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const auto& command : commands) {
      if (command.app != nullptr && command.app->parsed()) return command.run();
    }
    return 2;
  } catch (const paratrain::ConfigError& e) {
    std::fprintf(stderr, "paratrain: configuration error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paratrain: error: %s\n", e.what());
    return 1;
  }
}

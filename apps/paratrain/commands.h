// Sub-commands of the `paratrain` CLI. Each adds itself to the CLI11 app;
// main.cpp runs the one the user chose and turns exceptions into a message
// and an exit code.
#pragma once

#include <cstdlib>
#include <functional>
#include <string_view>

namespace CLI {
class App;
}

namespace paratrain::cli {

struct Command {
  CLI::App* app = nullptr;     // the CLI11 sub-command
  std::function<int()> run;    // returns the process exit code
  // run() itself honours parse_only() (checks more than CLI11 parsing:
  // train and federated load the config, launch checks its options);
  // otherwise main() exits 0 once CLI11 has parsed the command line.
  bool checks_parse_only = false;
};

// PARATRAIN_PARSE_ONLY=1: check the command line and exit 0 without doing
// the work (no training, no files written); `paratrain train` and
// `federated` also load the config, apply --set and validate it. The test
// that every command in README.md and docs/ parses (tests/docs/) runs them
// this way, so the docs cannot drift from the CLI.
inline bool parse_only() {
  const char* v = std::getenv("PARATRAIN_PARSE_ONLY");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

Command add_launch_command(CLI::App& app);  // launch_command.cpp
Command add_train_command(CLI::App& app);   // train_command.cpp
Command add_checkpoint_command(CLI::App& app);  // checkpoint_command.cpp
Command add_plan_command(CLI::App& app);    // plan_command.cpp
Command add_trace_command(CLI::App& app);   // trace_command.cpp
Command add_profile_command(CLI::App& app);  // profile_command.cpp
Command add_plot_command(CLI::App& app);    // plot_command.cpp
Command add_generate_command(CLI::App& app);  // generate_command.cpp
Command add_runs_command(CLI::App& app);    // runs_command.cpp
Command add_config_command(CLI::App& app);    // config_command.cpp
Command add_federated_command(CLI::App& app);  // federated_command.cpp
Command add_doctor_command(CLI::App& app);     // doctor_command.cpp
Command add_bench_command(CLI::App& app);      // bench_command.cpp
Command add_quantize_command(CLI::App& app);   // quantize_command.cpp
Command add_evaluate_command(CLI::App& app);   // quantize_command.cpp

}  // namespace paratrain::cli

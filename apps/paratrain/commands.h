// Sub-commands of the `paratrain` CLI. Each adds itself to the CLI11 app;
// main.cpp runs the one the user chose and turns exceptions into a message
// and an exit code.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace paratrain::cli {

struct Command {
  CLI::App* app = nullptr;     // the CLI11 sub-command
  std::function<int()> run;    // returns the process exit code
};

Command add_launch_command(CLI::App& app);  // launch_command.cpp
Command add_train_command(CLI::App& app);   // train_command.cpp
Command add_checkpoint_command(CLI::App& app);  // checkpoint_command.cpp
Command add_plan_command(CLI::App& app);    // plan_command.cpp
Command add_trace_command(CLI::App& app);   // trace_command.cpp
Command add_plot_command(CLI::App& app);    // plot_command.cpp
Command add_generate_command(CLI::App& app);  // generate_command.cpp
Command add_runs_command(CLI::App& app);    // runs_command.cpp
Command add_config_command(CLI::App& app);    // config_command.cpp
Command add_federated_command(CLI::App& app);  // federated_command.cpp
Command add_doctor_command(CLI::App& app);     // doctor_command.cpp
Command add_bench_command(CLI::App& app);      // bench_command.cpp

}  // namespace paratrain::cli

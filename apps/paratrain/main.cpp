// `paratrain` CLI entry: dispatches to sub-commands (launch, train, federated, checkpoint, plan, trace, plot, generate, config, doctor, bench).
// The only place that turns an exception into an exit code.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/core/allocator.h"
#include "paratrain/core/error.h"
#include "paratrain/core/exit_codes.h"

namespace {

// Edit distance counting a swap of neighbours as one edit ("trian" is one
// from "train"): optimal string alignment.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// CLI11 says only "The following arguments were not expected: trian" for a
// mistyped command; name the closest one instead. "" when `word` is a
// command, or an option (left to CLI11).
std::string unknown_command_message(const CLI::App& app, const std::string& word) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  if (word.empty() || word[0] == '-' || std::find(names.begin(), names.end(), word) != names.end()) return "";
  std::string best;
  size_t best_distance = 3;  // at most 2 edits: a typo, not another word
  for (const auto& name : names) {
    const size_t d = edit_distance(word, name);
    if (d < best_distance) best_distance = d, best = name;
  }
  std::string joined;
  for (const auto& name : names) joined += (joined.empty() ? "" : ", ") + name;
  return "paratrain: unknown command '" + word + "'" + (best.empty() ? "" : " (did you mean '" + best + "'?)") +
         "; the commands are " + joined + " (paratrain --help)";
}

}  // namespace

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
      paratrain::cli::add_profile_command(app),
      paratrain::cli::add_plot_command(app),
      paratrain::cli::add_generate_command(app),
      paratrain::cli::add_runs_command(app),
      paratrain::cli::add_config_command(app),
      paratrain::cli::add_federated_command(app),
      paratrain::cli::add_doctor_command(app),
      paratrain::cli::add_bench_command(app),
      paratrain::cli::add_quantize_command(app),
      paratrain::cli::add_evaluate_command(app),
  };
  if (argc > 1) {
    if (const auto message = unknown_command_message(app, argv[1]); !message.empty()) {
      std::fprintf(stderr, "%s\n", message.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A usage error exits 2 as with the configuration errors below (and
    // most Unix tools), not CLI11's own codes (106 for a missing option,
    // 104 for a bad number); --help and --version still exit 0.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (const auto& command : commands) {
      if (command.app == nullptr || !command.app->parsed()) continue;
      if (paratrain::cli::parse_only() && !command.checks_parse_only) return 0;
      return command.run();
    }
    return 2;
  } catch (const paratrain::ConfigError& e) {
    std::fprintf(stderr, "paratrain: configuration error: %s\n", e.what());
    return 2;
  } catch (const paratrain::CommError& e) {
    // Another rank (or the link to it) is gone: say so in the code too.
    std::fprintf(stderr, "paratrain: error: %s\n", e.what());
    return paratrain::kPeerLostExitCode;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paratrain: error: %s\n", e.what());
    return 1;
  }
}

// `paratrain plan --config FILE [--set k=v ...] [--world N] [--memory-gb G] [--json]`:
// prints per-rank memory of parameters, gradients and optimizer state for
// ZeRO stages 0-3 and which stage fits a budget. Only parses flags; the
// arithmetic lives in paratrain/train/memory_plan.h. Starts no processes.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/memory_plan.h"

namespace paratrain::cli {

Command add_plan_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    int64_t world = 0;
    double memory_gb = 0;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "plan", "Per-rank bytes of parameters, gradients and optimizer state for ZeRO stages 0-3, and the lowest "
              "stage that fits a memory budget");
  sub->add_option("-c,--config", args->config, "TOML config file, e.g. configs/fashion_mnist_mlp.toml")->required();
  sub->add_option("--set", args->overrides, "Override a config key: --set optimizer.kind=adam (repeatable)");
  sub->add_option("--world", args->world,
                  "ranks in the job; the dp group (world / (tp*pp*cp)) shards the state. Default: "
                  "parallel.dp * tp * pp * cp from the config, or 1 rank of data parallelism");
  sub->add_option("--memory-gb", args->memory_gb, "per-rank budget in GiB (2^30 bytes); 0 = none")
      ->capture_default_str();
  sub->add_flag("--json", args->json, "print JSON (exact byte counts) instead of the table");

  auto run = [args]() -> int {
    const auto config = train::load_config(args->config, args->overrides);
    const auto plan = train::plan_memory(config, {.world = args->world, .memory_gib = args->memory_gb});
    const std::string text = args->json ? train::plan_to_json(plan).dump(2) + "\n" : train::format_plan(plan);
    std::fputs(text.c_str(), stdout);
    return 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli

// `paratrain federated --config FILE [--set key=value ...]`: federated
// training (federated/run.h). Alone it is the server and every client; under
// `paratrain launch` rank 0 serves and the other ranks host the clients
// (`launch --keep-going` lets the run outlive a client process that dies).
#include <ATen/Parallel.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "apps/paratrain/commands.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/env.h"
#include "paratrain/core/logging.h"
#include "apps/paratrain/stop_status.h"
#include "paratrain/federated/run.h"
#include "paratrain/train/config/config.h"

namespace paratrain::cli {

Command add_federated_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string log_level = "info";
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "federated", "Federated learning from a TOML config: rank 0 serves, the ranks host simulated clients");
  sub->add_option("-c,--config", args->config, "TOML config file, e.g. configs/federated_fashion_mnist.toml")
      ->required();
  sub->add_option("--set", args->overrides, "Override a config key: --set federated.rounds=5 (repeatable)");
  sub->add_option("--log-level", args->log_level,
                  "trace, debug, info, warn, error, critical or off (PARATRAIN_LOG_LEVEL wins)");

  auto run = [args]() -> int {
    const auto world = comm::world_from_env();
    init_logging(world.rank, args->log_level, "--log-level");
    // Read the config before meeting the other ranks: a typo fails every rank at once.
    auto overrides = args->overrides;
    // `paratrain launch --backend B`; an explicit --set world.backend wins.
    if (auto backend = env::get("PARATRAIN_BACKEND")) overrides.insert(overrides.begin(), "world.backend=" + *backend);
    const auto config = train::load_config(args->config, overrides);
    if (parse_only()) return 0;  // PARATRAIN_PARSE_ONLY (commands.h): the config is valid
    if (!env::get("OMP_NUM_THREADS") && world.local_world_size > 1) at::set_num_threads(1);

    comm::InitOptions init;
    init.timeout = std::chrono::seconds(config.world.timeout_s);
    init.backend = config.world.backend;
    auto group = comm::init_process_group(world, init);

    // SIGTERM / SIGINT / SIGHUP: run.json says "stopped", as for `paratrain
    // train` (stop_status.h); rank 0 owns run.json.
    std::optional<StopStatusRecorder> stop_status;
    const auto result = federated::run_federated(config, *group, [&](const std::filesystem::path& dir) {
      if (world.rank == 0) stop_status.emplace(dir);  // federated rounds do not preempt yet
    });
    if (world.rank == 0)
      spdlog::info("done: {} rounds ({} applied), test accuracy {:.2f}% (loss {:.4f}); run dir {}", result.rounds,
                   result.rounds_applied, 100 * result.test.accuracy, result.test.loss, result.run_dir.string());
    // No closing barrier: a client process may have died, and the run
    // already ended with the server's stop and the hosts' goodbyes.
    return 0;
  };
  return {sub, run, /*checks_parse_only=*/true};
}

}  // namespace paratrain::cli

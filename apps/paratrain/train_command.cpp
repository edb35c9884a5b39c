// `paratrain train --config FILE [--set key=value ...]`: one rank of a
// training job. Under `paratrain launch`, torchrun, mpirun or srun each
// process reads its rank from the environment; alone it trains on one process.
#include <ATen/Parallel.h>

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/paratrain/commands.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/env.h"
#include "paratrain/core/logging.h"
#include "paratrain/train/config.h"
#include "paratrain/train/trainer.h"

namespace paratrain::cli {

Command add_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string log_level = "info";
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand("train", "Train a model from a TOML config (one rank; use `launch` for many)");
  sub->add_option("-c,--config", args->config, "TOML config file, e.g. configs/fashion_mnist_mlp.toml")->required();
  sub->add_option("--set", args->overrides, "Override a config key: --set optimizer.lr=0.01 (repeatable)");
  sub->add_option("--log-level", args->log_level,
                  "trace, debug, info, warn, error, critical or off (PARATRAIN_LOG_LEVEL wins)");

  auto run = [args]() -> int {
    const auto world = comm::world_from_env();
    init_logging(world.rank, args->log_level, "--log-level");  // a bad level: ConfigError, exit 2
    // Read the config before meeting the other ranks: a typo fails every
    // rank at once instead of leaving peers waiting at the rendezvous.
    // `paratrain launch --num-servers N` passes ps.servers this way; an
    // explicit --set ps.servers comes later and wins.
    auto overrides = args->overrides;
    if (auto servers = env::get("PARATRAIN_PS_SERVERS")) overrides.insert(overrides.begin(), "ps.servers=" + *servers);
    auto config = train::load_config(args->config, overrides);
    // Ranks share the machine's cores; one compute thread each unless the
    // user (or the launcher) said otherwise. See design.md.
    if (!env::get("OMP_NUM_THREADS") && world.local_world_size > 1) at::set_num_threads(1);

    comm::InitOptions init;
    init.timeout = std::chrono::seconds(config.world.timeout_s);
    init.backend = config.world.backend;
    auto group = comm::init_process_group(world, init);

    train::Trainer trainer(config, *group);
    auto result = trainer.fit();
    if (world.rank == 0) {
      std::string acc = result.test.count > 0 ? fmt::format("test accuracy {:.2f}% (loss {:.4f})",
                                                            100 * result.test.accuracy, result.test.loss)
                                              : std::string("no evaluation");
      spdlog::info("done: {} steps, {} epochs, {}, {:.0f} samples/s; run dir {}", result.steps,
                   result.epochs_completed, acc, result.samples_per_second, result.run_dir.string());
    }
    group->barrier()->wait();
    return 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli

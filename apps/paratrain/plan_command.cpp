// `paratrain plan --config FILE [--set k=v ...] [--world N] [--memory-gb G] [--json] [--measure]`:
// prints per-rank memory of parameters, gradients and optimizer state for
// ZeRO stages 0-3, the activations, and which stage fits a budget. The
// arithmetic lives in paratrain/train/memory_plan.h; with --measure it also
// launches the configuration for a few steps (`paratrain launch` of --world
// `paratrain train` processes, each counting its peak at LibTorch's CPU
// allocator: core/memory_meter.h) and prints predicted against measured.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/paratrain/commands.h"
#include "paratrain/core/error.h"
#include "paratrain/launch/launcher.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/memory_plan.h"

namespace paratrain::cli {
namespace {

namespace fs = std::filesystem;

// Sets an environment variable for a scope and puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// What each rank of a short run of the configuration allocated at its peak,
// less what it held when its data had loaded (the Trainer opens the meter's
// window there and closes it when the steps end): parameters, gradients,
// optimizer state, activations, buffers and backward's temporaries. Every
// rank runs on this machine. The folder (under $TMPDIR) is removed after a
// good run and kept, with the run's output, after a failed one.
std::vector<nlohmann::json> measure(const std::string& config, const std::vector<std::string>& overrides,
                                    int64_t world, int64_t steps) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (world > std::max<int64_t>(8, 4 * cores)) {
    throw ConfigError(fmt::format("paratrain plan --measure runs all {} ranks as processes on this machine ({} "
                                  "cores): measure a smaller layout (--world, parallel.*) with the same per-rank "
                                  "shapes instead",
                                  world, cores));
  }
  std::string tmpl = (fs::temp_directory_path() / "paratrain-plan-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw Error(fmt::format("paratrain plan --measure: cannot make {}", tmpl));
  const fs::path dir = tmpl;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  launch::LaunchOptions o;
  o.nproc_per_node = static_cast<int>(world);
  o.command = {self.string(), "train", "--config", config};
  for (const auto& kv : overrides) o.command.insert(o.command.end(), {"--set", kv});
  // Only the steps: no evaluation, no checkpoint inside the window, a fresh run.
  for (const std::string& kv :
       {"train.max_steps=" + std::to_string(steps), std::string("train.eval_every_epochs=0"),
        std::string("train.checkpoint_every_steps=0"), std::string("train.async_checkpoint=false"),
        "run.output_dir=" + (dir / "runs").string(), std::string("run.name=measure"), std::string("log.progress=off"),
        std::string("train.resume=")}) {
    o.command.insert(o.command.end(), {"--set", kv});
  }
  const fs::path log = dir / "launch.log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("paratrain plan --measure: cannot write {}", log.string()));
  o.out_fd = o.err_fd = fd;
  int rc = -1;
  try {
    const ScopedEnv meter("PARATRAIN_MEMORY_METER", dir.string());
    rc = launch::launch(o);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (rc != 0) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    std::string tail = text.str();
    if (tail.size() > 3000) tail = "..." + tail.substr(tail.size() - 3000);
    throw Error(fmt::format("paratrain plan --measure: the run of the configuration failed (exit {}); its "
                            "output ({}):\n{}",
                            rc, log.string(), tail));
  }
  std::vector<nlohmann::json> ranks;
  for (int64_t r = 0; r < world; ++r) {
    std::ifstream in(dir / fmt::format("rank_{}.json", r));
    if (!in) throw Error(fmt::format("paratrain plan --measure: rank {} wrote no reading in {}", r, dir.string()));
    ranks.push_back(nlohmann::json::parse(in));
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  return ranks;
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    int64_t world = 0;
    double memory_gb = 0;
    bool json = false;
    bool measure = false;
    int64_t measure_steps = 3;
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
  sub->add_flag("--measure", args->measure,
                "also run the configuration for --measure-steps steps on this machine (paratrain launch of the "
                "planned world) and print each rank's measured peak of tensor storage against the prediction");
  sub->add_option("--measure-steps", args->measure_steps, "optimizer steps of the measured run")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));

  auto run = [args]() -> int {
    const auto config = train::load_config(args->config, args->overrides);
    const auto plan = train::plan_memory(config, {.world = args->world, .memory_gib = args->memory_gb});
    if (!args->measure) {
      const std::string text = args->json ? train::plan_to_json(plan).dump(2) + "\n" : train::format_plan(plan);
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    // The prediction for the configured ZeRO stage: its model state plus the
    // activations of the fullest rank.
    const auto& stage = plan.stages.at(static_cast<size_t>(std::clamp<int64_t>(config.zero.stage, 0, 3)));
    const int64_t predicted = stage.total_bytes + train::bytes_beyond_state(plan, stage.stage);
    const int64_t world = plan.dp * config.parallel.tp * config.parallel.pp * config.parallel.cp;
    const auto ranks = measure(args->config, args->overrides, world, args->measure_steps);
    int64_t most = 0;
    for (const auto& r : ranks) most = std::max<int64_t>(most, r.at("training_peak_bytes").get<int64_t>());
    const double ratio = predicted > 0 ? static_cast<double>(most) / static_cast<double>(predicted) : 0;
    if (args->json) {
      nlohmann::json out = train::plan_to_json(plan);
      out["measured"] = {{"steps", args->measure_steps}, {"zero_stage", config.zero.stage},
                         {"predicted_bytes", predicted}, {"peak_bytes", most},
                         {"measured_over_predicted", ratio}, {"ranks", ranks}};
      std::fputs((out.dump(2) + "\n").c_str(), stdout);
      return 0;
    }
    std::string text = train::format_plan(plan);
    text += fmt::format("Measured ({} steps on {} process{}, tensor storage counted at LibTorch's CPU allocator "
                        "from the loaded data to the last step):\n",
                        args->measure_steps, world, world == 1 ? "" : "es");
    for (const auto& r : ranks) {
      text += fmt::format("  rank {}: peak {}\n", r.at("rank").get<int64_t>(),
                          human(static_cast<double>(r.at("training_peak_bytes").get<int64_t>())));
    }
    text += fmt::format("Predicted for zero.stage = {} ({}): {}; measured on the fullest rank: {} ({:.2f}x the "
                        "prediction)\n",
                        config.zero.stage,
                        plan.activations.modelled ? "state + buffers + activations + loader + gradient"
                                                  : "state + buffers only: no activation formula for this model",
                        human(static_cast<double>(predicted)), human(static_cast<double>(most)), ratio);
    std::fputs(text.c_str(), stdout);
    return 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli

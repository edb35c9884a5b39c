// `paratrain train --config FILE [--set key=value ...]`: one rank of a
// training job. Under `paratrain launch`, torchrun, mpirun or srun each
// process reads its rank from the environment; alone it trains on one process.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/paratrain/commands.h"
#include "apps/paratrain/stop_status.h"
#include "paratrain/core/exit_codes.h"
#include "paratrain/train/run/preemption.h"
#include "paratrain/comm/doctor/doctor_watchdog.h"
#include "paratrain/comm/peer_watch.h"
#include "paratrain/comm/rejoin.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/device.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"
#include "paratrain/core/logging.h"
#include "paratrain/core/memory_meter.h"
#include "paratrain/models/recompute.h"
#include "paratrain/core/atomic_file.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/recovery/restart_resume.h"
#include "paratrain/train/trainer.h"

namespace paratrain::cli {
namespace {

// PARATRAIN_FAULT_KILL=RANK:STEP makes rank RANK SIGKILL itself after
// optimizer step STEP, in generation 0 only (TORCHELASTIC_RESTART_COUNT
// unset or 0) so the restarted run goes through. Fault injection for trying
// and testing `paratrain launch --max-restarts`: a kill -9 at a known step,
// with no timing race between a test and the worker.
class FaultKill : public train::Callback {
 public:
  FaultKill(int64_t step) : step_(step) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    if (info.step != step_) return;
    spdlog::warn("PARATRAIN_FAULT_KILL: killing this rank with SIGKILL after step {}", step_);
    spdlog::default_logger()->flush();
    std::raise(SIGKILL);
  }

 private:
  int64_t step_;
};

// The step at which this rank kills (PARATRAIN_FAULT_KILL) or stops
// (PARATRAIN_FAULT_STOP) itself, if the variable says so. Step 0 (kill
// only): once every rank checked in, before the world is built.
std::optional<int64_t> fault_step(const comm::WorldInfo& world, const char* variable, const char* verb) {
  const int64_t first = std::string(variable) == "PARATRAIN_FAULT_KILL" ? 0 : 1;
  const auto spec = env::get(variable);
  if (!spec || world.restart_count > 0) return std::nullopt;
  int rank = -1;
  long long step = -1;
  char tail = 0;
  if (std::sscanf(spec->c_str(), "%d:%lld%c", &rank, &step, &tail) != 2 || rank < 0 || step < first) {
    throw ConfigError(fmt::format("environment variable {}='{}' must be RANK:STEP (e.g. 1:5: "
                                  "rank 1 {} itself after step 5{}); unset it to train normally",
                                  variable, *spec, verb,
                                  first == 0 ? "; 1:0: after its check-in, before the world is built" : ""));
  }
  if (rank != world.rank) return std::nullopt;
  return step;
}

// PARATRAIN_FAULT_STOP=RANK:STEP makes rank RANK SIGSTOP itself after
// optimizer step STEP (generation 0 only): a frozen process, alive but
// silent, for trying and testing heartbeat detection. Its peers block in the
// next collective; the launcher notices the missing heartbeats. It first
// lets its watchdog beat twice, so the last beat the launcher reads
// describes the state the rank froze in (a real freeze can be up to one
// world.heartbeat_s newer than the last beat).
class FaultStop : public train::Callback {
 public:
  FaultStop(int64_t step, const comm::DoctorWatchdog* watchdog, const comm::PeerWatch* peers)
      : step_(step), watchdog_(watchdog), peers_(peers) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    if (info.step != step_) return;
    spdlog::warn("PARATRAIN_FAULT_STOP: stopping this rank with SIGSTOP after step {}", step_);
    spdlog::default_logger()->flush();
    if (watchdog_ != nullptr && watchdog_->beats() > 0) {  // beating: under paratrain launch
      const int64_t seen = watchdog_->beats();
      while (watchdog_->beats() < seen + 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (peers_ != nullptr) {  // the same for the beats the peers receive (comm/peer_watch.h)
      const int64_t seen = peers_->beats();
      while (peers_->beats() < seen + 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::raise(SIGSTOP);
  }

 private:
  int64_t step_;
  const comm::DoctorWatchdog* watchdog_;
  const comm::PeerWatch* peers_;
};

// The hang doctor's watchdog for this rank: SIGUSR1 dumps, and heartbeats
// when `paratrain launch` asked for them (PARATRAIN_HEARTBEAT_DIR).
// The file is named by the launch rank (RANK), which the launcher watches:
// after a start without a dead rank (Note [Shrinking at start-up]) the
// group's ranks are renumbered.
std::unique_ptr<comm::DoctorWatchdog> start_watchdog(comm::ProcessGroup& group, int launch_rank,
                                                     const train::TrainConfig& config) {
  auto recorder = comm::recorder_of(group);
  if (!recorder) return nullptr;
  comm::WatchdogOptions options;
  if (auto dir = env::get("PARATRAIN_HEARTBEAT_DIR"); dir && config.world.heartbeat_s > 0) {
    options.heartbeat_file = std::filesystem::path(*dir) / fmt::format("rank-{}.json", launch_rank);
    options.interval = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(config.world.heartbeat_s * 1000)));
    options.timeout = std::chrono::milliseconds(std::llround(config.world.heartbeat_timeout_s * 1000));
  }
  return std::make_unique<comm::DoctorWatchdog>(std::move(recorder), options);
}

// Note [Who watches heartbeats]
// The ranks watch each other (comm/peer_watch.h) whenever no launcher sees
// all of them: hand-started jobs, torchrun, mpirun and srun (no
// PARATRAIN_HEARTBEAT_DIR), and every multi-node job, because a node's
// `paratrain launch` watches only its own node's ranks, and a stopped or
// partitioned node is silent only to the others. A one-node `paratrain
// launch` already watches every rank, and does more on a verdict (SIGUSR1 to
// collect every rank's records, restarts): a second detector there would
// only race it to name the same failure. Not with elastic.in_job either: the
// watch holds the world group, which in-job recovery replaces (its
// membership round has its own window, world.heartbeat_timeout_s).
// world.heartbeat_s = 0 turns both off.
std::unique_ptr<comm::PeerWatch> start_peer_watch(comm::ProcessGroup& group, const comm::WorldInfo& world,
                                                  const comm::InitOptions& init, const train::TrainConfig& config) {
  if (config.world.heartbeat_s <= 0 || group.size() < 2 || config.elastic.in_job) return nullptr;
  const bool launcher_sees_all = env::get("PARATRAIN_HEARTBEAT_DIR").has_value() &&
                                 world.local_world_size == world.world_size;
  if (launcher_sees_all) return nullptr;
  comm::PeerWatchOptions options;
  options.interval = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(config.world.heartbeat_s * 1000)));
  options.timeout = std::chrono::milliseconds(std::llround(config.world.heartbeat_timeout_s * 1000));
  options.bind_address = comm::rank_address(world, init);
  auto watch = std::make_unique<comm::PeerWatch>(group, options);
  if (group.rank() == 0)
    spdlog::info("peer heartbeats: every rank beats to every other every {:g} s and aborts the job's collectives "
                 "when a peer is silent for {:g} s (world.heartbeat_s, world.heartbeat_timeout_s)",
                 config.world.heartbeat_s, config.world.heartbeat_timeout_s);
  return watch;
}

// `paratrain launch --backend B` and `--num-servers N` reach the workers as
// PARATRAIN_BACKEND and PARATRAIN_PS_SERVERS, applied as overrides: a bad
// value must name the variable (and the flag that sets it), not a
// `--set world.backend=...` the user never typed.
void check_env_override(const char* variable, const char* flag, const std::string& key, const std::string& value) {
  train::TrainConfig probe;
  try {
    train::apply_override(probe, key + "=" + value);
  } catch (const ConfigError& e) {
    std::string message = e.what();
    const std::string where = "--set " + key + "=" + value + ": ";
    if (message.rfind(where, 0) == 0) message.erase(0, where.size());
    throw ConfigError(fmt::format("environment variable {}='{}' (which `paratrain launch {}` sets): {}; fix the "
                                  "flag or unset the variable",
                                  variable, value, flag, message));
  }
}

}  // namespace

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
    if (auto servers = env::get("PARATRAIN_PS_SERVERS")) {
      check_env_override("PARATRAIN_PS_SERVERS", "--num-servers", "ps.servers", *servers);
      overrides.insert(overrides.begin(), "ps.servers=" + *servers);
    }
    // `paratrain launch --backend B` passes world.backend the same way.
    if (auto backend = env::get("PARATRAIN_BACKEND")) {
      check_env_override("PARATRAIN_BACKEND", "--backend", "world.backend", *backend);
      overrides.insert(overrides.begin(), "world.backend=" + *backend);
    }
    auto config = train::load_config(args->config, overrides);
    if (parse_only()) return 0;  // PARATRAIN_PARSE_ONLY (commands.h): the config is valid
    // A restarted worker (`paratrain launch --max-restarts`, torchrun)
    // continues the run its first generation began: that run version, from
    // its latest complete checkpoint (restart_resume.h). Its overrides come
    // last, so they win over --set. Every rank decides before any rank can
    // write (they meet only later, in init_process_group), so all agree.
    const std::string launch_id = env::get_or("PARATRAIN_LAUNCH_ID", world.run_id);
    if (world.restart_count > 0) {
      const auto plan = train::restart_resume(config, launch_id, world.restart_count);
      if (world.rank == 0) spdlog::info("{}", plan.message);
      if (!plan.overrides.empty()) {
        overrides.insert(overrides.end(), plan.overrides.begin(), plan.overrides.end());
        config = train::load_config(args->config, overrides);
      }
      // elastic.keep_global_batch: a generation at another world size keeps
      // the starting global batch (restart_resume.h).
      if (const auto dir = train::continued_run_dir(config, plan)) {
        const auto keep = train::keep_global_batch(config, *dir, world.world_size);
        if (world.rank == 0 && !keep.message.empty()) spdlog::info("{}", keep.message);
        if (!keep.overrides.empty()) {
          overrides.insert(overrides.end(), keep.overrides.begin(), keep.overrides.end());
          config = train::load_config(args->config, overrides);
        }
      }
    }
    // `paratrain plan --measure`: the peak of tensor storage, written per rank at the end.
    const auto meter_dir = env::get("PARATRAIN_MEMORY_METER");
    if (meter_dir) core::install_memory_meter();
    const auto kill_step = fault_step(world, "PARATRAIN_FAULT_KILL", "kills");
    const auto stop_step = fault_step(world, "PARATRAIN_FAULT_STOP", "stops");
    // Ranks share the machine's cores; one compute thread each unless the
    // user (or the launcher) said otherwise. See design.md.
    if (!env::get("OMP_NUM_THREADS") && world.local_world_size > 1) at::set_num_threads(1);

    comm::InitOptions init;
    init.timeout = std::chrono::seconds(config.world.timeout_s);
    init.backend = config.world.backend;
    // "auto" must not pick shared memory for GPU tensors.
    init.cpu_tensors = core::resolve_device(config.world.device, world.local_rank).is_cpu();
    init.doctor_records = static_cast<std::size_t>(config.world.doctor_records);
    if (kill_step == 0)
      init.after_check_in = [] {
        spdlog::warn("PARATRAIN_FAULT_KILL: killing this rank with SIGKILL after its check-in");
        spdlog::default_logger()->flush();
        std::raise(SIGKILL);
      };
    // elastic.in_job: the store stays in use after the rendezvous, for the
    // survivors' membership rounds; a rank that has not arrived within
    // world.heartbeat_timeout_s counts as dead (docs/elastic.md).
    std::shared_ptr<comm::ProcessGroup> group;
    std::shared_ptr<comm::Rejoiner> rejoiner;
    if (config.elastic.in_job) {
      // Gloo sends with writev(), which raises SIGPIPE when the peer's socket
      // is closed: a survivor writing to a dead rank would be killed before it
      // saw the error. Ignored, the write fails with EPIPE and the collective
      // with a CommError that in-job recovery handles. (Python, which Gloo
      // usually runs under, ignores SIGPIPE from the start.)
      std::signal(SIGPIPE, SIG_IGN);
      auto elastic = comm::init_elastic_process_group(
          world, init, std::chrono::milliseconds(static_cast<int64_t>(1000 * config.world.heartbeat_timeout_s)));
      group = std::move(elastic.group);
      rejoiner = std::move(elastic.rejoiner);
    } else {
      group = comm::init_process_group(world, init);
    }
    auto watchdog = start_watchdog(*group, world.rank, config);
    auto peer_watch = start_peer_watch(*group, world, init, config);

    train::Trainer trainer(config, *group);
    if (rejoiner) trainer.enable_in_job_recovery(rejoiner);
    // Lets a later generation of this launch find the version (run.json).
    // The group's rank and size: elastic.in_job may have started without a
    // rank that died at start-up (Note [Shrinking at start-up]).
    if (group->rank() == 0) train::record_launch_id(trainer.run_dir(), launch_id, group->size());
    // SIGTERM / SIGINT / SIGHUP: run.json says "stopped", not "running"
    // (which `paratrain runs` would call "died"); rank 0 owns run.json.
    std::optional<StopStatusRecorder> stop_status;
    if (group->rank() == 0) stop_status.emplace(trainer.run_dir());
    if (kill_step > 0) trainer.add_callback(std::make_shared<FaultKill>(*kill_step));
    if (stop_step) trainer.add_callback(std::make_shared<FaultStop>(*stop_step, watchdog.get(), peer_watch.get()));
    train::TrainResult result;
    try {
      result = trainer.fit();
    } catch (const TimeoutError& e) {
      if (!peer_watch) throw;
      throw TimeoutError(e.what() + peer_watch->name_peers_in(e.what()));
    } catch (const CommError& e) {
      // Gloo names a lost peer by address only; the launcher names nodes by rank.
      if (!peer_watch) throw;
      throw CommError(e.what() + peer_watch->name_peers_in(e.what()));
    }
    if (result.preempted) {
      if (result.rank == 0)
        spdlog::warn("preempted by {} at step {}: checkpoint {}; exiting with code {} (the next start with "
                     "train.resume = \"auto\" continues from it)",
                     train::preempt_signal_name(result.preempt_signal), result.steps, result.last_checkpoint.string(),
                     kPreemptedExitCode);
      group->barrier()->wait();
      return kPreemptedExitCode;
    }
    if (meter_dir) {
      const auto m = core::memory_meter();
      const nlohmann::json reading = {{"rank", world.rank},
                                      {"baseline_bytes", m.baseline_bytes},
                                      {"peak_bytes", m.peak_bytes},
                                      {"training_peak_bytes", m.peak_bytes - m.baseline_bytes}};
      write_file_atomically(std::filesystem::path(*meter_dir) / fmt::format("rank_{}.json", world.rank),
                                  reading.dump() + "\n");
    }
    if (result.rank == 0 && (config.train.activation_checkpointing != "none" || config.pipeline.checkpoint_activations))
      spdlog::info("recomputed in backward: {} segments on this rank", models::recomputed_segments());
    if (result.rank == 0) {  // after an in-job recovery: the re-elected rank 0
      std::string acc = result.test.count > 0 ? fmt::format("test accuracy {:.2f}% (loss {:.4f})",
                                                            100 * result.test.accuracy, result.test.loss)
                                              : std::string("no evaluation");
      spdlog::info("done: {} steps ({:.3g} epochs), {}, {:.0f} samples/s; run dir {}", result.steps,
                   result.epochs_trained, acc, result.samples_per_second, result.run_dir.string());
    }
    // After an in-job recovery the first world is aborted; the Trainer's
    // last collective (the final evaluation or save) already met the survivors.
    if (result.recoveries == 0) group->barrier()->wait();
    return 0;
  };
  return {sub, run, /*checks_parse_only=*/true};
}

}  // namespace paratrain::cli

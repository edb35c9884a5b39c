// A federated run: see run.h.
#include "paratrain/federated/run.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"
#include "paratrain/federated/partition.h"
#include "paratrain/federated/rdp_accountant.h"
#include "paratrain/federated/round.h"
#include "paratrain/federated/server_checkpoint.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/train/run/metrics.h"
#include "paratrain/train/run/run_dir.h"

namespace paratrain::federated {
namespace {

// Rank 0 creates the run's version folder and tells the others its number,
// as the Trainer does (they may not share a listing of the folder).
std::filesystem::path run_dir_for(const train::TrainConfig& config, comm::ProcessGroup& world) {
  int64_t version = -1;
  std::string error;
  if (world.rank() == 0) {
    try {
      version = *train::parse_version_name(train::create_run_dir(config).filename().string());
    } catch (const ConfigError& e) {
      error = e.what();
    }
  }
  if (world.size() > 1) {
    auto t = torch::tensor({version}, torch::kLong);
    world.broadcast(t, 0)->wait();
    version = t.item<int64_t>();
  }
  if (!error.empty()) throw ConfigError(error);
  if (version < 0)
    throw ConfigError(fmt::format("rank {}: rank 0 could not create the run directory under {}; see its log",
                                  world.rank(), config.run.output_dir));
  return train::version_dir(std::filesystem::path(config.run.output_dir) / config.run.name, version);
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

Evaluation evaluate(models::Model& model, const data::TensorDataset& data, int64_t chunk) {
  torch::NoGradGuard no_grad;
  model.eval();
  Evaluation out;
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < data.size(); begin += chunk) {
    const int64_t end = std::min(data.size(), begin + chunk);
    const auto logits = model.forward(data.inputs.slice(0, begin, end));
    const auto targets = data.targets.slice(0, begin, end);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(targets).sum().item<int64_t>();
  }
  model.train();
  out.count = data.size();
  if (out.count > 0) {
    out.loss = loss_sum / static_cast<double>(out.count);
    out.accuracy = static_cast<double>(correct) / static_cast<double>(out.count);
  }
  return out;
}

namespace {

FederatedResult run_in(const train::TrainConfig& config, comm::ProcessGroup& world, std::filesystem::path dir) {
  const auto& f = config.federated;
  const bool server = world.rank() == 0;
  FederatedResult result;
  result.run_dir = std::move(dir);
  if (server) write_file_atomically(result.run_dir / "config.toml", train::to_toml(config));
  // The server writes checkpoints alone (the sharded writer is collective
  // over its group): a one-rank group, made while every rank is alive.
  std::shared_ptr<comm::ProcessGroup> self = world.size() > 1 ? world.new_subgroup({0}) : nullptr;
  comm::ProcessGroup* checkpoint_group = world.size() > 1 ? self.get() : &world;

  const auto datasets = train::load_datasets(config);
  // The same seed on every rank; rank 0's weights win anyway (FederatedRun
  // broadcasts them), this only keeps the ranks' copies alike from the start.
  torch::manual_seed(config.run.seed);
  std::shared_ptr<models::Model> model = train::make_model(config);
  if (config.train.activation_checkpointing != "none") {
    // Clients train with recomputed layers as the Trainer's ranks do (the
    // same names and weights: the wrapper adopts the model's modules).
    model = std::make_shared<models::RecomputedModel>(std::move(model), train::recompute_policy(config));
  }
  FederatedRun run(config, world, model, datasets.train);
  if (!server) {
    // A client host serves the server's rounds until it stops the run.
    while (!run.stopped()) run.run_round(0);
    run.finish();
    result.rounds = f.rounds;
    return result;
  }

  const auto labels = labels_of(datasets.train);
  const int64_t classes = *std::max_element(labels.begin(), labels.end()) + 1;
  spdlog::info("federated: {} ranks (rank 0 serves{}), {} clients, {} per round, partition \"{}\"{}, algorithm "
               "{}{}, server optimizer {} (lr {}), {} parameters{}",
               world.size(), world.size() > 1 ? ", the others host the clients" : " and hosts every client",
               f.clients, std::max<int64_t>(1, std::llround(f.fraction * f.clients)), f.partition,
               f.partition == "dirichlet" ? fmt::format(" (alpha {})", f.alpha) : "", f.algorithm,
               f.algorithm == "fedprox" ? fmt::format(" (mu {})", f.mu) : "", f.server_optimizer, f.server_lr,
               run.global().numel(),
               f.round_timeout_s > 0 ? fmt::format(", round deadline {} s", f.round_timeout_s) : "");
  spdlog::info("partition: {}", summarize_partition(labels, run.partition(), classes));

  // Resume (train.resume = "auto" or a checkpoint path): the model, the
  // server optimizer's moments and the run's position. See Note [Federated checkpoint].
  ServerProgress progress;
  if (!config.train.resume.empty()) {
    std::optional<std::filesystem::path> from;
    if (config.train.resume == "auto") {
      from = checkpoint::find_latest_checkpoint(result.run_dir);
      if (!from) spdlog::info("train.resume = auto: no complete checkpoint in {}; starting fresh", result.run_dir.string());
    } else {
      from = std::filesystem::path(config.train.resume);
    }
    if (from) {
      progress = load_server_checkpoint(*from, run, config);
      spdlog::info("resumed from {} after round {} ({} applied){}", from->string(), progress.round,
                   progress.rounds_applied,
                   f.client_optimizer_state == "keep" ? "; clients' own optimizers start afresh (not checkpointed)"
                                                      : "");
    }
  }
  result.rounds_applied = progress.rounds_applied;

  train::MetricsLog metrics(result.run_dir / "metrics.jsonl");
  const bool dp = f.dp_clip > 0;
  for (int64_t round = progress.round + 1; round <= f.rounds; ++round) {
    const auto started = std::chrono::steady_clock::now();
    RoundReport report = run.run_round(round);
    const bool last = round == f.rounds;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    progress.round = round;
    progress.bytes_up += report.bytes_up;
    progress.bytes_down += report.bytes_down;
    progress.rounds_applied += report.applied ? 1 : 0;
    result.rounds_applied = progress.rounds_applied;
    nlohmann::json record = {{"round", round},
                             {"clients_sampled", report.sampled.size()},
                             {"clients_reported", report.reported},
                             {"clients_dropped", static_cast<int64_t>(report.sampled.size()) - report.reported},
                             {"applied", report.applied},
                             {"train_loss", report.train_loss},
                             {"bytes_up", report.bytes_up},
                             {"bytes_down", report.bytes_down},
                             {"round_seconds", seconds}};
    if (!report.dropped.empty()) record["dropped"] = report.dropped;
    if (!report.failed.empty()) record["dropped_failed"] = report.failed;
    if (!report.late.empty()) record["dropped_late"] = report.late;
    if (!report.lost.empty()) record["dropped_lost"] = report.lost;
    if (!report.lost_ranks.empty()) record["lost_ranks"] = report.lost_ranks;
    if (!run.lost_ranks().empty()) record["clients_alive"] = report.pool;
    std::string dp_text;
    if (dp) {
      // A skipped round released nothing about the clients' data. The
      // sampling rate is over the clients still alive.
      // See Note [Sampling in the accountant].
      if (report.applied)
        progress.accountant.add_rounds(static_cast<double>(report.sampled.size()) / static_cast<double>(report.pool),
                                       f.dp_noise_multiplier);
      const double eps = f.dp_noise_multiplier > 0 ? progress.accountant.epsilon(f.dp_delta)
                                                   : std::numeric_limits<double>::infinity();
      record["epsilon"] = std::isfinite(eps) ? nlohmann::json(eps) : nlohmann::json("inf");
      record["delta"] = f.dp_delta;
      dp_text = fmt::format(", epsilon {:.3g} (delta {:g})", eps, f.dp_delta);
    }
    std::string eval_text;
    if (last || (f.eval_every > 0 && round % f.eval_every == 0)) {
      result.test = evaluate(run.model(), datasets.test);
      record["test_accuracy"] = result.test.accuracy;
      record["test_loss"] = result.test.loss;
      eval_text = fmt::format(", test accuracy {:.2f}% (loss {:.4f})", 100 * result.test.accuracy, result.test.loss);
    }
    metrics.write(record);
    const std::string lost_text =
        report.lost_ranks.empty() ? "" : fmt::format(", lost process rank {}", fmt::join(report.lost_ranks, ", "));
    spdlog::info("round {}/{}: {}/{} clients reported{}{}, train loss {:.4f}{}{}, up {} down {}, {:.2f} s", round,
                 f.rounds, report.reported, report.sampled.size(), report.applied ? "" : " (skipped)", lost_text,
                 report.train_loss, eval_text, dp_text, megabytes(progress.bytes_up), megabytes(progress.bytes_down),
                 seconds);
    if (last || (f.checkpoint_every > 0 && round % f.checkpoint_every == 0))
      save_server_checkpoint(checkpoint::checkpoint_dir(result.run_dir, round), *checkpoint_group, run, progress, config);
  }
  run.finish();
  if (!run.lost_ranks().empty())
    spdlog::warn("the run lost client process(es) rank {} and finished with the others",
                 fmt::join(run.lost_ranks(), ", "));
  result.rounds = f.rounds;
  return result;
}

}  // namespace

// run.json as `paratrain train` keeps it (train/run/run_dir.h): "running", then
// "finished" or "failed" with the error; a signal's "stopped" is the CLI's
// (on_run_dir hands it the folder). Rank 0 owns the file.
FederatedResult run_federated(const train::TrainConfig& config, comm::ProcessGroup& world,
                              const std::function<void(const std::filesystem::path&)>& on_run_dir) {
  // Before the run folder exists: clients train with their own loop, which
  // neither freezes nor distills; the keys would be ignored silently.
  if (config.model.moe_experts > 0) {
    throw ConfigError("model.moe_experts applies to paratrain train: a federated client would route its tokens "
                      "alone and train without the load-balancing loss; set model.moe_experts = 0");
  }
  if (!config.freeze.modules.empty() || config.freeze.adaptive || !config.distill.teacher.empty()) {
    throw ConfigError("freeze.* and distill.* apply to paratrain train; federated clients train whole models on "
                      "labels: leave freeze.modules empty, freeze.adaptive = false and distill.teacher = """);
  }
  const bool server = world.rank() == 0;
  const std::filesystem::path dir = run_dir_for(config, world);
  if (server) {
    train::update_run_status(dir, {{"status", "running"}, {"pid", ::getpid()}, {"started", train::unix_time()},
                                   {"world_size", world.size()}, {"strategy", "federated"},
                                   {"version", dir.filename().string()}});
  }
  if (on_run_dir) on_run_dir(dir);
  try {
    FederatedResult r = run_in(config, world, dir);
    if (server) {
      nlohmann::json done = {{"status", "finished"}, {"ended", train::unix_time()}, {"steps", r.rounds}};
      if (r.test.count > 0) done["test"] = {{"loss", r.test.loss}, {"accuracy", r.test.accuracy}};
      train::update_run_status(dir, done);
    }
    return r;
  } catch (const std::exception& e) {
    if (server) {
      try {
        train::update_run_status(dir, {{"status", "failed"}, {"ended", train::unix_time()}, {"error", e.what()}});
      } catch (const std::exception&) {
        // The run's own error matters more than a status file that failed too.
      }
    }
    throw;
  }
}

}  // namespace paratrain::federated

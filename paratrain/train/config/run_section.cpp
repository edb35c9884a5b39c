// The schema rows and cross-key rules of [run], [train] and [log] (run_section.h).
#include "paratrain/train/config/run_section.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"
#include "paratrain/train/run/preemption.h"

namespace paratrain::train::detail {

namespace {

Check<std::string> preempt_signal_list() {
  return [](const std::string& v) -> std::string {
    try {
      (void)parse_preempt_signals(v);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
}

}  // namespace

std::vector<FieldSpec> run_fields() {
  using TC = TrainConfig;
  return {
      field("run.name", &TC::run, &RunConfig::name, "outputs go to <output_dir>/<name>/version_<N>/", path_component()),
      field("run.version", &TC::run, &RunConfig::version, "-1 = a new version_N per run (with train.resume = \"auto\": the newest version holding a checkpoint); N = exactly version_N", in_range<int64_t>(-1, 999999999)),
      field("run.output_dir", &TC::run, &RunConfig::output_dir, "parent folder of all runs", non_empty()),
      field("run.seed", &TC::run, &RunConfig::seed, "seeds model init and data shuffling", at_least<int64_t>(0)),
      field("run.log_every", &TC::run, &RunConfig::log_every, "steps between log lines (0 = per epoch only)", in_range<int64_t>(0, kMaxCount)),
  };
}

std::vector<FieldSpec> train_fields() {
  using TC = TrainConfig;
  return {
      field("train.epochs", &TC::train, &TrainLoopConfig::epochs, "passes over the training set", in_range<int64_t>(1, kMaxCount)),
      field("train.max_steps", &TC::train, &TrainLoopConfig::max_steps, "stop after this many optimizer steps (0 = no limit)", in_range<int64_t>(0, kMaxCount)),
      field("train.eval_every_epochs", &TC::train, &TrainLoopConfig::eval_every_epochs, "test-set evaluation period (0 = never)", in_range<int64_t>(0, kMaxCount)),
      field("train.checkpoint_every_steps", &TC::train, &TrainLoopConfig::checkpoint_every_steps, "0 = checkpoint at epoch ends only", in_range<int64_t>(0, kMaxCount)),
      field("train.resume", &TC::train, &TrainLoopConfig::resume, "\"\" = fresh, \"auto\" = latest in the run dir (damaged ones moved aside as step_N.unreadable), or a checkpoint path"),
      field("train.keep_checkpoints", &TC::train, &TrainLoopConfig::keep_checkpoints, "keep only the newest N checkpoints (0 = all)", in_range<int64_t>(0, kMaxCount)),
      field("train.async_checkpoint", &TC::train, &TrainLoopConfig::async_checkpoint, "write checkpoints in the background: a save copies the state and training goes on; index.json is still written last, and the next save waits for the previous one"),
      field("train.accumulate", &TC::train, &TrainLoopConfig::accumulate, "micro-batches per optimizer step (gradient accumulation; an epoch's incomplete last step is dropped)", in_range<int64_t>(1, kMaxRanks)),
      field("train.monitor", &TC::train, &TrainLoopConfig::monitor, "metric that picks checkpoints/best and drives early stopping: \"test_loss\", \"test_accuracy\", \"perplexity\", \"train_loss\", a program's own \"test_<name>\" (its Task's sums) or \"\" (none)", monitor_name()),
      field("train.mode", &TC::train, &TrainLoopConfig::mode, "\"min\", \"max\" or \"auto\" (max for accuracies): which way train.monitor improves", one_of({"auto", "min", "max"})),
      field("train.patience", &TC::train, &TrainLoopConfig::patience, "early stopping: evaluations without improvement of train.monitor before stopping (0 = never stop early)", in_range<int64_t>(0, kMaxCount)),
      field("train.min_delta", &TC::train, &TrainLoopConfig::min_delta, "smallest change of train.monitor that counts as an improvement", in_range_finite(0.0, 1e30, "a non-negative number")),
      field("train.preempt_signals", &TC::train, &TrainLoopConfig::preempt_signals, "signals that preempt: every rank stops at the same step boundary, writes a checkpoint, marks run.json \"preempted\" and exits 75; a second signal exits at once. \"auto\" (the default) = SIGTERM and SIGINT (off under elastic.in_job and parameter servers, whose ranks meet only through pushes and pulls), or a list, e.g. \"SIGTERM,SIGUSR2\" (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2; SIGUSR1 is otherwise the hang doctor's); \"\" = off (a signal ends the run at once)", preempt_signal_list()),
      field("train.activation_checkpointing", &TC::train, &TrainLoopConfig::activation_checkpointing, "\"none\", \"blocks\" (recompute each chosen layer of the model in backward, keeping only its input) or \"every_k\" (runs of train.checkpoint_every_k chosen layers); gradients equal those without it, dropout replays; every strategy; one more forward of the chosen layers", one_of({"none", "blocks", "every_k"})),
      field("train.checkpoint_every_k", &TC::train, &TrainLoopConfig::checkpoint_every_k, "layers per recomputed segment with train.activation_checkpointing = \"every_k\"", in_range<int64_t>(1, kMaxCount)),
      field("train.checkpoint_layers", &TC::train, &TrainLoopConfig::checkpoint_layers, "glob patterns over the model's layer names (\"blocks.*\", \"fc1\", a Sequential's \"3\") that activation checkpointing may recompute; [] = every layer but the last"),
  };
}

std::vector<FieldSpec> log_fields() {
  using TC = TrainConfig;
  return {
      field("log.tensorboard", &TC::log, &LogConfig::tensorboard, "also write TensorBoard scalar event files to <run_dir>/tensorboard/"),
      field("log.progress", &TC::log, &LogConfig::progress, "\"auto\" (a progress bar on a terminal, log lines otherwise), \"on\" or \"off\"", one_of({"auto", "on", "off"})),
  };
}

std::string run_problem(const TrainConfig& c) {
  // "auto" turns itself off there (preempt_signals_of); a list is refused.
  if (!c.train.preempt_signals.empty() && c.train.preempt_signals != "auto") {
    if (const auto why = preemption_unavailable(c); !why.empty())
      return fmt::format("train.preempt_signals = \"{}\" with {}; use one of them ({})", c.train.preempt_signals,
                         why,
                         c.elastic.in_job ? "restart-based recovery, `paratrain launch --max-restarts`, works with "
                                            "preemption"
                                          : "set ps.dynamic_batches = false");
  }
  if (c.train.activation_checkpointing != "none" && c.quant.qat)
    return fmt::format("train.activation_checkpointing = \"{}\" with quant.qat = true: quantization-aware training "
                       "swaps fake-quantized weights in for its forward only, so a recompute in backward would see "
                       "the float weights; use one of them",
                       c.train.activation_checkpointing);
  if (c.train.activation_checkpointing != "none" && c.ps.servers > 0)
    return fmt::format("train.activation_checkpointing = \"{}\" with parameter servers (ps.servers = {}): their "
                       "workers run the model layer by layer as each layer's pull arrives, outside the "
                       "recomputed segments; use data parallelism (DDP, ZeRO, FSDP) for activation checkpointing",
                       c.train.activation_checkpointing, c.ps.servers);
  if (c.train.activation_checkpointing == "none" && !c.train.checkpoint_layers.empty())
    return "train.checkpoint_layers chooses layers for activation checkpointing, but "
           "train.activation_checkpointing = \"none\": set it to \"blocks\" or \"every_k\", or "
           "train.checkpoint_layers = []";
  if (c.train.patience > 0 && c.train.monitor.empty())
    return fmt::format("train.patience = {} stops on a monitored metric, but train.monitor is empty: set "
                       "train.monitor (e.g. \"test_loss\"), or train.patience = 0",
                       c.train.patience);
  if (!c.train.monitor.empty() && c.train.eval_every_epochs == 0)
    return fmt::format("train.monitor = \"{}\" is read at evaluations, but train.eval_every_epochs = 0 never "
                       "evaluates: set train.eval_every_epochs >= 1, or train.monitor = \"\"",
                       c.train.monitor);
  if (c.train.monitor == "perplexity" && !builds_gpt(c))
    return fmt::format("train.monitor = \"perplexity\" is logged for language models only (model.kind = \"{}\"): "
                       "monitor \"test_loss\" or \"test_accuracy\"",
                       c.model.kind);
  return "";
}

}  // namespace paratrain::train::detail

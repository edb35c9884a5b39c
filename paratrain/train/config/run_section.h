// [run], [train] and [log]: where a run writes, the loop (length, evaluation, checkpoints,
// resume, accumulation, monitoring) and what it reports.
// The sections of TrainConfig (config.h) that configure the Trainer and its loop (train/trainer.h, train/loop/, train/run/).
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in run_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// `[run]`: where a run writes and how it is seeded.
struct RunConfig {
  std::string name = "fashion_mnist_mlp";  ///< the run's folder name under output_dir
  std::string output_dir = "runs";  ///< the run writes into `<output_dir>/<name>/version_<N>/` (run_dir.h)
  /// -1 = a new version per run (the newest one with train.resume = "auto");
  /// N >= 0 = exactly version_N, e.g. to resume or compare a known run.
  int64_t version = -1;
  int64_t seed = 0;                 ///< model init, sampler shuffles, dropout: one seed for all
  int64_t log_every = 50;           ///< steps between log lines (0 = only per epoch)

  bool operator==(const RunConfig&) const = default;
};

/// `[train]`: the loop: length, evaluation, checkpoints, resume, accumulation,
/// monitoring and early stopping.
struct TrainLoopConfig {
  int64_t epochs = 3;  ///< passes over the training set
  int64_t max_steps = 0;               ///< 0 = no limit; else stop after this many optimizer steps
  int64_t eval_every_epochs = 1;       ///< 0 = never evaluate
  int64_t checkpoint_every_steps = 0;  ///< 0 = only at the end of each epoch
  std::string resume;                  ///< "" = fresh start, "auto" = latest in the run dir, or a path
  int64_t keep_checkpoints = 0;        ///< 0 = keep all; else only the newest N
  /// Write checkpoints in the background: a save copies this rank's state and
  /// training goes on while a thread writes the files and commits index.json
  /// last (as atomic as a synchronous save); the next save waits for it.
  bool async_checkpoint = false;
  /// Micro-batches per optimizer step (gradient accumulation): the first
  /// accumulate - 1 backwards accumulate locally (no_sync), the last reduces
  /// the sum; each micro-batch loss is divided by accumulate, so one step
  /// equals one step on the accumulate-times larger batch. Steps, max_steps
  /// and checkpoint_every_steps count optimizer steps; the last batches of an
  /// epoch that do not fill a whole step are dropped.
  int64_t accumulate = 1;
  /// A metric of the evaluation ("test_loss", "test_accuracy", "perplexity",
  /// "train_loss"); "" = none. When set, checkpoints/best links to the
  /// checkpoint with its best value (callbacks.h).
  std::string monitor;
  std::string mode = "auto";  ///< "min" | "max" | "auto" (max for accuracies)
  /// Early stopping: stop after this many evaluations without an improvement
  /// of the monitored metric by more than min_delta; 0 = never.
  int64_t patience = 0;
  double min_delta = 0.0;  ///< smallest change that counts as an improvement
  /// Preemption (docs/launchers.md, "Preemption"): comma-separated signals,
  /// e.g. "SIGTERM,SIGUSR2", after which every rank stops at the same step
  /// boundary, writes a checkpoint, marks run.json "preempted" and exits
  /// with code 75 (kPreemptedExitCode); "auto" (the default) = SIGTERM and
  /// SIGINT except under elastic.in_job and parameter servers
  /// (run/preemption.h, preempt_signals_of); "" = off (a signal ends the
  /// run at once). One of them reaching one rank is enough.
  std::string preempt_signals = "auto";
  /// Activation checkpointing (docs/activation-checkpointing.md;
  /// models/recompute.h): "none" keeps every activation; "blocks" recomputes
  /// each chosen layer of the model's layers() in backward, keeping only its
  /// input; "every_k" recomputes runs of checkpoint_every_k chosen layers.
  /// Gradients are bitwise those without it (dropout replays); it costs one
  /// more forward of the chosen layers.
  std::string activation_checkpointing = "none";
  int64_t checkpoint_every_k = 2;  ///< layers per recomputed segment with "every_k"
  /// Glob patterns over layer names ("blocks.*", "fc1", a Sequential's "3"):
  /// the layers that may be recomputed; empty = every layer but the last.
  std::vector<std::string> checkpoint_layers;

  bool operator==(const TrainLoopConfig&) const = default;
};

/// What the run reports besides metrics.jsonl and the log lines.
struct LogConfig {
  /// TensorBoard scalar event files in `<run_dir>/tensorboard/` (tensorboard.h).
  bool tensorboard = false;
  /// "auto" = an updating progress bar when rank 0 writes to a terminal
  /// (also through `paratrain launch` on one), log lines otherwise; "on"; "off".
  std::string progress = "auto";

  bool operator==(const LogConfig&) const = default;
};

}  // namespace paratrain::train

// The Trainer: the training loop that composes model, data, optimizer and a
// parallelism strategy from a TrainConfig, and owns the run directory
// (config, metrics.jsonl, checkpoints). It builds the device mesh, picks the
// strategy by name (strategy_registry.h) and talks to it only through the
// Strategy interface (strategy.h); batch sizes, sampling, evaluation splits
// and metric reductions use the data-parallel group, not the world.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/task.h"
#include "paratrain/train/user_module.h"

namespace paratrain::comm {
class Rejoiner;
}
namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace paratrain::train {

/// One evaluation of the model on the test (or validation) split.
struct EvalResult {
  double loss = 0;        ///< the task's mean loss per prediction (cross-entropy for the built-ins)
  double accuracy = 0;    ///< argmax == target (next-token accuracy for a language model); 0 when the task has none
  int64_t count = 0;      ///< predictions: test examples, or validation tokens for a language model
  double perplexity = 0;  ///< exp(loss) for a language model; 0 otherwise
  /// Every figure, as logged: "test_<name>" for each of the task's sums
  /// (test_loss, test_accuracy, a user task's own), then derived ones
  /// ("perplexity").
  std::vector<std::pair<std::string, double>> metrics;
};

/// What a program brings besides its config: its own model, task and data
/// (the C++ user's LightningModule and DataModule). A part left empty comes
/// from the config as for `paratrain train`: model.kind, the built-in task
/// for it (task_for_config), data.dataset.
struct TrainerParts {
  /// The model, built once per rank under run.seed: any_module(builder) for
  /// any torch::nn::Module (user_module.h), or a builder of a paratrain model.
  ModelBuilder model;
  /// Its loss and evaluation metrics (task.h).
  std::shared_ptr<Task> task;
  /// The train and test sets: every rank must get the same rows in the same
  /// order (the sampler splits them).
  std::function<Datasets(const TrainConfig&)> data;
};

/// What Trainer::fit() did.
struct TrainResult {
  int64_t steps = 0;             ///< optimizer steps taken in total (incl. before a resume)
  int64_t start_step = 0;        ///< > 0 when this run resumed from a checkpoint
  int64_t epochs_completed = 0;  ///< whole epochs finished
  double epochs_trained = 0;     ///< epochs the loader went through, fractions included (40 of 468 batches: 0.085)
  double last_train_loss = 0;    ///< mean over ranks of the last logged window
  EvalResult test;               ///< last evaluation (count 0 when none ran)
  double samples_per_second = 0; ///< global throughput of this process's training steps
  int64_t global_batch = 0;      ///< examples per optimizer step over all dp ranks
  std::filesystem::path run_dir;          ///< where the run wrote (see Trainer::run_dir())
  std::filesystem::path last_checkpoint;  ///< the newest checkpoint written (empty when none)
  int64_t skipped_steps = 0;     ///< steps the loss scaler skipped (inf/nan gradients) in this process
  double loss_scale = 1.0;       ///< the loss scaler's scale at the end (1 without one)
  bool stopped_early = false;    ///< a callback (train.patience) ended training
  /// A preemption signal (train.preempt_signals) stopped training at a
  /// checkpoint of this step; the CLI exits with kPreemptedExitCode.
  bool preempted = false;
  int preempt_signal = 0;        ///< which signal (SIGTERM, ...) when preempted
  int64_t recoveries = 0;        ///< in-job recoveries from a dead rank (elastic.in_job)
  int world_size = 0;            ///< ranks at the end (fewer than at the start after recoveries)
  int rank = 0;                  ///< this process's rank at the end (renumbered by recoveries)
  /// data.batch_shares: each dp rank's micro-batch size at the end (what
  /// "auto" settled on); empty without shares.
  std::vector<int64_t> batch_shares;
};

/// Trains a model from a TrainConfig on every rank: builds the strategy the
/// config names (DDP, ZeRO, FSDP, pipeline, tensor parallel, parameter
/// servers), data, optimizer and schedule, then runs the loop with evaluation,
/// checkpoints, logs and callbacks. What `paratrain train` runs.
class Trainer {
 public:
  /// `world` must outlive the trainer; every rank constructs one with the
  /// same config (and parts). Builds everything up front so errors surface
  /// before step 1. With `parts.model`, strategies that cut a model into
  /// layers (parallel.pp, tp, cp > 1) are a ConfigError.
  Trainer(TrainConfig config, comm::ProcessGroup& world, TrainerParts parts = {});
  ~Trainer();

  /// Trains for train.epochs (or train.max_steps), evaluating and
  /// checkpointing as configured; resumes first when train.resume is set.
  /// Records the run's status in `<run_dir>/run.json` (running, finished, or
  /// failed with the error). While its loop runs it handles the signals of
  /// train.preempt_signals (by default SIGTERM and SIGINT): the first one
  /// makes every rank stop at one step boundary with a checkpoint and
  /// return with `preempted` set; set the key to "" to keep the program's
  /// own handlers.
  TrainResult fit();

  /// elastic.in_job = true: when a peer dies, this rank re-forms the world
  /// with the other survivors through `rejoiner`'s store and goes on (see
  /// docs/elastic.md, "In-job recovery"). Call on every rank before fit();
  /// fit() refuses elastic.in_job without it (ConfigError).
  void enable_in_job_recovery(std::shared_ptr<comm::Rejoiner> rejoiner);

  /// Runs after the config's built-ins (best checkpoint, early stopping,
  /// TensorBoard, progress bar); add on every rank, before fit().
  void add_callback(std::shared_ptr<Callback> callback);

  /// `<run.output_dir>/<run.name>/version_<N>` (run_dir.h).
  std::filesystem::path run_dir() const;

  /// The task's metrics of the current model on the test set, reduced over
  /// ranks (each rank evaluates a strided share). Collective.
  EvalResult evaluate();

  /// The module being trained. Under ZeRO-3 its parameters are views of
  /// freed storage between steps: read weights through full_parameters().
  std::shared_ptr<torch::nn::Module> model() const;
  /// Every parameter in full, by name (identical on every rank). Collective.
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();
  /// The distillation teacher's parameters in full, by name (distill.teacher;
  /// empty without one). Collective when the teacher is sharded (FSDP) or
  /// cut into pipeline stages.
  std::vector<std::pair<std::string, at::Tensor>> teacher_parameters();
  /// "ddp (bucketed)", "zero (stage 2)", ...
  std::string strategy_name() const;
  /// The optimizer over the strategy's optimizer_params() (shard pieces under
  /// ZeRO): its rate is the [lr] schedule's for the last step taken.
  torch::optim::Optimizer& optimizer();

  struct State;

 private:
  TrainResult fit_loop();
  std::unique_ptr<State> s_;
};

}  // namespace paratrain::train

// Trainer callbacks: user code hooked into the training loop (as Lightning
// and Keras callbacks are), and the built-ins the config switches on: early
// stopping and best-checkpoint tracking on a monitored metric. Loggers that
// write files (TensorBoard) and the progress bar are callbacks too
// (tensorboard.h, progress.h). Not the loop itself (train/loop/fit_loop.h).
//
// Every rank runs every callback, with values already reduced over the ranks
// (identical everywhere), so a decision such as "stop now" is the same on
// every rank without another collective. Callbacks that write files do so on
// rank 0 only (`FitInfo::is_main`).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace paratrain::train {

struct FitInfo {
  std::filesystem::path run_dir;
  int64_t start_step = 0;   // > 0 after a resume
  int64_t total_steps = 0;  // optimizer steps the run will take in all
  int64_t steps_per_epoch = 0;
  int64_t epochs = 0;
  int64_t global_batch = 0;
  bool is_main = false;     // rank 0: the rank that writes files
};

struct StepInfo {
  int64_t step = 0;         // optimizer steps done, counting this one
  int64_t total_steps = 0;
  int64_t epoch = 0;        // from 0
  int64_t epochs = 0;
  int64_t batch = 0;        // loader batches of this epoch consumed
  int64_t batches = 0;      // loader batches per epoch
  double lr = 0;            // the rate this step used
  double samples_per_s = 0; // global, since this process started training
  double eta_s = 0;         // estimated seconds to the last step
  // Mean over ranks of the steps since the last logged step; NaN on steps
  // that do not log (run.log_every), where the loss is not reduced.
  double loss = std::numeric_limits<double>::quiet_NaN();
};

struct EvalInfo {
  int64_t step = 0;
  int64_t epoch = 0;
  // Everything the evaluation logged: "test_loss", "test_accuracy",
  // "perplexity" (language models), plus "train_loss" (the last logged mean).
  std::vector<std::pair<std::string, double>> metrics;
  int64_t count = 0;  // predictions evaluated: test examples, or validation tokens
  std::optional<double> get(const std::string& name) const;
};

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_fit_start(const FitInfo&) {}
  // After each optimizer step.
  virtual void on_train_batch_end(const StepInfo&) {}
  // After an epoch's last step (also when train.max_steps ends one early),
  // before its evaluation.
  virtual void on_train_epoch_end(int64_t /*epoch*/) {}
  // Every record the Trainer writes to metrics.jsonl ("kind": "train" |
  // "eval"); on rank 0 only, the rank that writes it.
  virtual void on_log(const nlohmann::json& /*record*/) {}
  virtual void on_validation_end(const EvalInfo&) {}
  // After a checkpoint committed (every rank).
  virtual void on_checkpoint(int64_t /*step*/, const std::filesystem::path& /*checkpoint*/) {}
  virtual void on_fit_end(int64_t /*steps*/) {}
  // Asked after each validation: true ends training there (the checkpoint of
  // that step is still written). Must be the same on every rank.
  virtual bool should_stop() const { return false; }
};

using CallbackPtr = std::shared_ptr<Callback>;

// "min" or "max" for a monitored metric: train.mode = "auto" picks max for
// accuracies and min for everything else (losses, perplexity).
std::string resolve_monitor_mode(const std::string& metric, const std::string& mode);

// Tracks the best value of a monitored metric over validations.
class MetricTracker {
 public:
  MetricTracker(std::string metric, std::string mode, double min_delta = 0.0);
  // True when `value` improves on the best so far by more than min_delta
  // (the first value always does); NaN never improves.
  bool update(double value);
  double best() const { return best_; }
  const std::string& metric() const { return metric_; }

 private:
  std::string metric_;
  bool maximize_;
  double min_delta_;
  double best_ = std::numeric_limits<double>::quiet_NaN();
};

// Early stopping (train.patience): stops when the monitored metric has not
// improved for `patience` validations in a row.
class EarlyStopping : public Callback {
 public:
  EarlyStopping(std::string metric, std::string mode, int64_t patience, double min_delta = 0.0);
  void on_validation_end(const EvalInfo& eval) override;
  bool should_stop() const override { return stop_; }
  int64_t stopped_epoch() const { return stopped_epoch_; }  // -1 while running

 private:
  MetricTracker tracker_;
  int64_t patience_;
  int64_t bad_ = 0;
  bool stop_ = false;
  int64_t stopped_epoch_ = -1;
};

// Keeps the checkpoint with the best monitored value: after each checkpoint
// of an improved step, <run_dir>/checkpoints/best points at it (a symbolic
// link, swapped atomically) and best.json records step, metric and value;
// pruning (train.keep_checkpoints) spares it. Writes on rank 0.
class BestCheckpoint : public Callback {
 public:
  BestCheckpoint(std::string metric, std::string mode, double min_delta = 0.0);
  void on_fit_start(const FitInfo& fit) override;
  void on_validation_end(const EvalInfo& eval) override;
  void on_checkpoint(int64_t step, const std::filesystem::path& checkpoint) override;
  std::optional<int64_t> best_step() const { return best_step_; }

 private:
  MetricTracker tracker_;
  std::filesystem::path run_dir_;
  bool is_main_ = false;
  std::optional<int64_t> pending_;    // improved at this step, checkpoint not yet written
  std::optional<int64_t> best_step_;  // the step `best` points at
  double pending_value_ = 0;
};

// The checkpoint `checkpoints/best` points at, if any (prune_checkpoints
// keeps it).
std::optional<std::filesystem::path> best_checkpoint(const std::filesystem::path& run_dir);

}  // namespace paratrain::train

// The Trainer: the training loop that composes model, data, optimizer and a
// data-parallel strategy from a TrainConfig, and owns the run directory
// (config, metrics.jsonl, checkpoints). The only layer that combines
// strategies; it talks to them through GradientSync (strategy.h).
#pragma once

#include <filesystem>
#include <memory>

#include "paratrain/comm/process_group.h"
#include "paratrain/train/config.h"

namespace torch::nn {
class Module;
}

namespace paratrain::train {

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t count = 0;
};

struct TrainResult {
  int64_t steps = 0;             // optimizer steps taken in total (incl. before a resume)
  int64_t start_step = 0;        // > 0 when this run resumed from a checkpoint
  int64_t epochs_completed = 0;
  double last_train_loss = 0;    // mean over ranks of the last logged window
  EvalResult test;               // last evaluation (count 0 when none ran)
  double samples_per_second = 0; // global throughput of this process's training steps
  std::filesystem::path run_dir;
  std::filesystem::path last_checkpoint;
};

class Trainer {
 public:
  // `world` must outlive the trainer; every rank constructs one with the
  // same config. Builds everything up front so errors surface before step 1.
  Trainer(TrainConfig config, comm::ProcessGroup& world);
  ~Trainer();

  // Trains for train.epochs (or train.max_steps), evaluating and
  // checkpointing as configured; resumes first when train.resume is set.
  TrainResult fit();

  // Test-set loss and accuracy of the current model, reduced over ranks
  // (each rank evaluates a strided share). Collective.
  EvalResult evaluate();

  // The model being trained (identical on every rank after each step).
  std::shared_ptr<torch::nn::Module> model() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace paratrain::train

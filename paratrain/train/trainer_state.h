// Trainer::State: everything the training loop holds, shared by trainer.cpp,
// the loop's parts (train/loop/) and the in-job recovery that rebuilds part
// of it (in_job.cpp). Internal to paratrain/train; users see trainer.h only.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "paratrain/comm/rejoin.h"
#include "paratrain/data/loader.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/optim/lr_schedule.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/distill/teacher.h"
#include "paratrain/train/freeze/freezing.h"
#include "paratrain/train/run/metrics.h"
#include "paratrain/train/strategies/strategy.h"
#include "paratrain/train/task.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

using topology::Axis;

struct Trainer::State {
  TrainConfig config;
  // The world this rank trains in: the caller's group, or after an in-job
  // recovery (in_job.h) the one the survivors built, held in owned_world.
  comm::ProcessGroup* world;
  std::shared_ptr<comm::ProcessGroup> owned_world;
  std::shared_ptr<comm::Rejoiner> rejoiner;  // elastic.in_job; null otherwise
  std::filesystem::path run_dir;
  ModelBuilder model_builder;  // TrainerParts::model; empty: model.kind
  std::shared_ptr<Task> task;  // the loss and metrics: TrainerParts::task or task_for_config
  std::unique_ptr<topology::DeviceMesh> mesh;
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<optim::GradScaler> scaler;  // precision.loss_scale; null for "none"
  Datasets datasets;
  BatchSizes batch;
  std::unique_ptr<data::Loader> loader;
  FrozenSet frozen;  // freeze.modules as the model builder froze them (empty when off)
  std::unique_ptr<Teacher> teacher;  // distill.teacher; null when off
  c10::Device device{c10::kCPU};  // world.device: the model's, and every batch is moved here
  std::optional<optim::LrSchedule> lr_schedule;  // [lr]: the rate of every optimizer step
  MetricsLog metrics;
  std::vector<CallbackPtr> callbacks;  // built-ins from the config, then the user's
  bool progress_bar = false;           // a bar replaces the periodic step log lines
  int64_t step = 0;
  int64_t start_step = 0;  // where this process started (after a resume)
  // Last: destroyed first, waiting for a background save before the rest goes.
  std::unique_ptr<TrainingCheckpointer> checkpointer;

  State(TrainConfig c, comm::ProcessGroup& w, std::filesystem::path dir)
      : config(std::move(c)), world(&w), run_dir(std::move(dir)),
        metrics(w.rank() == 0 ? run_dir / "metrics.jsonl" : std::filesystem::path()) {}
  bool is_main() const { return world->rank() == 0; }
  template <typename F>
  void each_callback(F&& f) {
    for (auto& cb : callbacks) f(*cb);
  }
  // One metrics.jsonl record (rank 0), also handed to the callbacks.
  void log_record(nlohmann::json record) {
    record["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    metrics.write(record);
    each_callback([&](Callback& cb) { cb.on_log(record); });
  }
  comm::ProcessGroup& dp() const { return mesh->group(Axis::kDp); }
  std::chrono::milliseconds timeout() const { return std::chrono::seconds(config.world.timeout_s); }
};

// The strategy over s.mesh with its model drawn from run.seed, the optimizer
// over its tensors and the loss scaler: the run's start. The Trainer's
// constructor and in-job recovery's rollback (in_job_rollback.cpp) both.
// Collective (the strategy's broadcast of the initial weights).
void build_model_and_optimizer(Trainer::State& s);

// The task's metrics of `forward` on the test set, each dp rank a strided
// share, reduced over dp (Trainer::evaluate with the strategy's eval_forward;
// distillation's teacher with its own). Every rank runs the same number of
// forwards. Collective.
EvalResult evaluate_forward(Trainer::State& s, const std::function<at::Tensor(const at::Tensor&)>& forward);

}  // namespace paratrain::train

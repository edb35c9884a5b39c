// Strategy: what a parallelism strategy owns, seen from the training loop.
// The Trainer (trainer.h) keeps the loop, logging, metrics, evaluation and the
// checkpoint policy; a strategy owns how the model is wrapped or cut, which
// tensors the optimizer steps, which data this rank reads, one forward and
// backward, the optimizer step, and what each rank holds for checkpoints.
// Strategies are picked by name through a registry (strategy_registry.h);
// the Trainer never names a strategy type. Adapters live in train/strategies/.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/core/model_state.h"
#include "paratrain/core/tensor_slot.h"
#include "paratrain/data/dataset.h"
#include "paratrain/optim/layer_norms.h"
#include "paratrain/checkpoint/sharded.h"

namespace torch::optim {
class Optimizer;
}
namespace paratrain::models {
class Model;
}
namespace paratrain::optim {
class GradScaler;
}

namespace paratrain::train {

// Per-step communication timings, for progress lines and benchmarks.
struct SyncStats {
  double backward_ms = 0;   // first gradient ready -> end of backward
  double comm_ms = 0;       // wall time with a collective in flight
  double hidden_share = 0;  // part of comm_ms overlapped with backward
  double exposed_ms = 0;    // waited on communication after backward
};


// Which share of the data this rank reads: its rank and size on the
// data-parallel axis (not the world: tp/pp/cp peers read the same data).
struct DataShard {
  int rank = 0;
  int size = 1;
  // False on a rank that trains no data of its own (a parameter server): it
  // steps the loop beside the others, but its loss and evaluation share are
  // empty and not counted.
  bool computes = true;
};

// Builds a fresh model; the Trainer seeds torch first, so every call on every
// rank gives the same initial weights as the single-process model.
using ModelFactory = std::function<std::shared_ptr<models::Model>()>;
// Mean loss of a micro-batch from the model's output and the targets.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& targets)>;

// What a layer-wise optimizer (LARS, LAMB: optim/lars.h, lamb.h) needs to
// know about the tensors it steps, parallel to optimizer_params().
struct LayerwiseParams {
  // dim() of the full tensor each optimizer param is a piece of: biases and
  // norm weights are excluded by it (ZeRO and FSDP pieces are flat).
  std::vector<int64_t> full_dims;
  // Completes per-tensor norms across the ranks holding pieces of a tensor
  // (optim::sharded_norm_reducer); empty when each param is a whole tensor.
  optim::NormReducer norm_reducer;
};

struct StepOutput {
  at::Tensor loss;  // detached scalar: this rank's mean loss on its micro-batch
};

// The core every strategy implements: ten methods. What only some
// strategies have is a facet below (checkpoint slots, telemetry, dynamic
// batches), found with facet<F>(strategy).
class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;

  // Builds the model (calls `factory` as often as it needs: a pipeline stage
  // keeps only its layers) and wraps it. Collective over the strategy's
  // groups (replicas start identical). Called once, before anything else.
  virtual void build_model(const ModelFactory& factory) = 0;
  // The module being trained; parameters may be shards or freed between
  // steps (ZeRO-3), so read weights through full_parameters().
  virtual std::shared_ptr<torch::nn::Module> module() const = 0;

  // The tensors the optimizer steps: full parameters (DDP) or this rank's
  // shard pieces (ZeRO, FSDP). Called once, after build_model.
  virtual std::vector<at::Tensor> optimizer_params() = 0;
  // Called once, after optimizer_params(). The default: whole tensors.
  virtual LayerwiseParams layerwise_params() {
    LayerwiseParams out;
    for (const auto& p : optimizer_params()) out.full_dims.push_back(p.dim());
    return out;
  }
  virtual DataShard data_shard() const = 0;

  // Forward, loss and backward of this rank's micro-batch. With `sync`
  // false gradients accumulate locally (no_sync); the next synchronized
  // call reduces the sum. Collective when sync is true.
  virtual StepOutput forward_backward(const data::Batch& batch, const LossFn& loss, bool sync) = 0;
  // Clips the global gradient norm to `clip_grad_norm` (0 = off; the norm
  // is over every parameter, across shards), steps, and makes parameters
  // ready for the next forward (ZeRO-1/2: all-gather). Returns false when
  // the step was skipped. Collective.
  // With a `scaler` (mixed precision; the LossFn multiplied the loss by
  // scaler->get_scale()): gradients are unscaled before clipping, and if any
  // rank or shard holds inf/nan (the flag agreed over every axis whose ranks
  // hold different gradients) every rank skips the step and returns false;
  // then scaler->update(). The default argument lives here only: call
  // through Strategy.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer, double clip_grad_norm,
                              optim::GradScaler* scaler = nullptr) = 0;

  // Forward for evaluation (under NoGradGuard, model in eval mode): DDP
  // brings buffers in line first, FSDP gathers units. Collective.
  virtual at::Tensor eval_forward(const at::Tensor& inputs) = 0;

  // Every parameter in full, by name, on every rank. Collective.
  virtual std::vector<std::pair<std::string, at::Tensor>> full_parameters() = 0;
};

// Facet: what this rank holds for checkpoints (train/checkpointing.h).
// Every built-in strategy has it; the Trainer refuses checkpoints of one
// that does not (checkpoint_slots()).
class CheckpointSlots {
 public:
  virtual ~CheckpointSlots() = default;
  // What this rank holds of every parameter and buffer, and of every tensor
  // the optimizer steps. Loading fills the slots in place, then
  // after_load() restores what follows from them (ZeRO-1/2: all-gather).
  virtual std::vector<TensorSlot> model_slots() = 0;
  virtual std::vector<checkpoint::OptimizerSlot> optimizer_slots() = 0;
  virtual void after_load() {}
  // Other state carried between steps (a comm hook's: PowerSGD's error
  // feedback and Q), saved as "state/<name>" beside the model and optimizer.
  // A load fills these slots (called anew for it), then calls state_loaded()
  // with the names the checkpoint lacked, which must start afresh.
  virtual std::vector<TensorSlot> state_slots() { return {}; }
  virtual void state_loaded(const std::vector<std::string>& missing) { (void)missing; }
  // Metadata recorded in the checkpoint (stage, layout); informative only:
  // any layout loads at any other.
  virtual std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const { return {}; }
};

// Facet: figures for progress lines, metrics.jsonl and benchmarks.
class Telemetry {
 public:
  virtual ~Telemetry() = default;
  virtual SyncStats last_stats() const { return {}; }
  // Records for metrics.jsonl, written at the end of Trainer::fit (objects
  // with a "kind"; only rank 0's reach the file). Collective: every rank
  // calls it. Parameter servers: each worker's staleness histogram.
  virtual std::vector<nlohmann::json> final_metrics() { return {}; }
  virtual ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const = 0;
};

// Facet: ranks that take different numbers of steps (parameter servers in
// async mode: Note [Dynamic batches] in param_server/server.h). The batch
// schedule (train/loop/batch_schedule.h) drives it.
class DynamicBatches {
 public:
  virtual ~DynamicBatches() = default;
  // Before the loop: this process will take `steps` optimizer steps (fewer
  // after a resume). Parameter servers size their receives by it.
  virtual void begin_run(int64_t steps) = 0;
  // True on every rank or on none: then each epoch runs as windows of steps
  // between the points where all ranks meet (the epoch's end, a checkpoint,
  // train.max_steps), each as begin_window(), then steps while next_item()
  // >= 0: item x is dp rank x % size's step x / size of its sampler share.
  virtual bool dynamic_batches() const = 0;
  // The window's first step within the epoch and its number of steps
  // (dp size x steps items).
  virtual void begin_window(int64_t first_step, int64_t steps) = 0;
  // The next item this rank trains, or -1 when its part of the window is
  // done. A rank that computes nothing returns items whose step / size is
  // each step of the window once.
  virtual int64_t next_item() = 0;
};

// The facet F of `strategy`, or null when it has none.
template <typename F>
F* facet(Strategy& strategy) {
  return dynamic_cast<F*>(&strategy);
}
template <typename F>
const F* facet(const Strategy& strategy) {
  return dynamic_cast<const F*>(&strategy);
}
// The checkpoint facet; throws Error naming the strategy when it has none.
CheckpointSlots& checkpoint_slots(Strategy& strategy);

}  // namespace paratrain::train

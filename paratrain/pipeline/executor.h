// The pipeline executor: runs one stage's schedule (schedule.h) of
// micro-batch forwards and backwards over its local model chunks, receiving
// inputs and output gradients from its neighbours and sending its own
// (p2p.h). The same executor runs every schedule: a schedule is only the
// order of actions. Not here: cutting the model (stage.h), data parallelism
// across pipeline replicas (the Trainer's pipeline strategy, via hooks).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/pipeline/p2p.h"
#include "paratrain/pipeline/schedule.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/pipeline/timeline.h"

namespace paratrain::pipeline {

// One model chunk this rank runs.
struct LocalChunk {
  std::shared_ptr<StageModule> module;
  int model_chunk = 0;                // position in the whole model: local index * stages + stage
  std::vector<int64_t> input_shape;   // per example
  at::ScalarType input_dtype = at::kFloat;
  std::vector<int64_t> output_shape;  // per example
  at::ScalarType output_dtype = at::kFloat;
};

struct ExecutorOptions {
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  // stages = pp size, microbatches, virtual_stages = local chunks.
  ScheduleOptions shape;
  // Recompute each chunk's forward in its backward: a micro-batch keeps only
  // its chunk input alive between forward and backward (one more forward).
  bool checkpoint_activations = false;
  // Autocast dtype of every chunk's forward and the last chunk's loss
  // (kFloat = off; see core/autocast.h). Stage boundaries stay fp32: a chunk's
  // output is widened before it is sent, so the gradient coming back is fp32.
  at::ScalarType autocast = at::kFloat;
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  // Model chunks [0, frozen_chunks) train nothing and feed nothing that
  // trains (their parameters are frozen, and so is every earlier chunk's):
  // they run forward without autograd history and skip their backward, and
  // chunk frozen_chunks neither keeps nor sends back its input's gradient.
  // The schedule is unchanged; their backward slots are simply empty.
  int frozen_chunks = 0;
  // Experiments and tests (profile.test_slow_factor on this rank): after each
  // chunk's forward and backward, sleep (compute_slowdown - 1) times what it
  // took, so the stage computes that many times slower, between its sends
  // and receives as a slower machine would. 1 = off.
  double compute_slowdown = 1.0;
};

// What the strategy does around compute, for data parallelism over
// pipeline replicas (DDP on each chunk: prepare before a forward, reduce only
// in the chunk's last backward of the step). Any may be empty.
struct ExecutorHooks {
  std::function<void(int local_chunk)> before_forward;
  std::function<void(int local_chunk, bool last_backward)> before_backward;
  std::function<void(int local_chunk, bool last_backward)> after_backward;
};

// Mean loss of a micro-batch from the last chunk's output and the targets.
using MicrobatchLoss = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& targets)>;

// Note [The rows of a micro-batch's loss]
// A loss with per-row data of its own besides the targets (distillation's
// teacher logits, computed for the whole batch before the step) must cut it
// as the executor cut the batch. While the executor calls a MicrobatchLoss
// (in the forward, and again in a recompute), current_loss_rows() on that
// thread says which rows of the step's batch the call covers; elsewhere it
// is {0, -1}: the whole batch.
struct LossRows {
  int64_t begin = 0;
  int64_t count = -1;  // -1: the whole batch
};
LossRows current_loss_rows();

struct StepReport {
  // Defined on the rank holding the last model chunk: the batch's loss as
  // single-process training computes it (micro-batch means weighted by rows).
  at::Tensor loss;
  int peak_in_flight = 0;             // (micro-batch, chunk) activations alive at once, at most
  int64_t peak_activation_bytes = 0;  // their bytes (layer outputs, or chunk inputs when recomputing)
};

class Executor {
 public:
  // `pp` must outlive the executor; `chunks` in local order (chunk i has
  // model_chunk i * stages + pp.rank()).
  Executor(comm::ProcessGroup& pp, std::vector<LocalChunk> chunks, ExecutorOptions options);

  // One training step over a batch every stage reads alike (only the first
  // model chunk uses `inputs`, only the last `targets`). Gradients
  // accumulate into the chunks' .grad, scaled so that their sum over
  // micro-batches is the gradient of the batch's mean loss. `step` labels
  // timeline events; `timeline` may be null.
  StepReport train_step(const at::Tensor& inputs, const at::Tensor& targets, const MicrobatchLoss& loss,
                        const ExecutorHooks& hooks, Timeline* timeline, int64_t step);

  // Forward only, whole batch as one micro-batch, under no_grad: the output
  // on the rank holding the last chunk, undefined elsewhere.
  at::Tensor forward_only(const at::Tensor& inputs);

  const std::vector<LocalChunk>& chunks() const { return chunks_; }
  const ExecutorOptions& options() const { return options_; }
  int64_t bytes_sent() const { return p2p_.bytes_sent(); }

 private:
  comm::ProcessGroup& pp_;
  std::vector<LocalChunk> chunks_;
  ExecutorOptions options_;
  P2p p2p_;
};

}  // namespace paratrain::pipeline

// Executor: see executor.h. Walks the schedule's actions in order; each
// forward or backward waits only for its own input (posted one action ahead
// so the transfer overlaps the action before), and each send returns at once.
// Why that cannot deadlock: see Note [Pipeline progress].
#include "paratrain/pipeline/executor.h"

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <thread>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/autocast.h"
#include "paratrain/core/error.h"
#include "paratrain/core/loss_weight.h"
#include "paratrain/core/phase.h"
#include "paratrain/models/recompute.h"

namespace paratrain::pipeline {
namespace {

// Note [Pipeline progress]
// A rank blocks only in wait_recv(), for the input of its next action; sends
// never block (P2p keeps them in flight until the end of the step). So a stage
// waits only for an action of a neighbour that the data dependencies put
// before its own, and the schedules order every rank's actions consistently
// with those dependencies (simulate.h checks that for every schedule). Gloo
// moves a message once both sides have posted it; receives are posted one
// action ahead, so the copy runs while the previous action computes.

// Micro-batch `mb`'s tag for eval: outside the training range of indices.
constexpr int kEvalMicrobatch = (1 << 18) - 1;

std::vector<int64_t> with_rows(int64_t rows, const std::vector<int64_t>& per_example) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), per_example.begin(), per_example.end());
  return shape;
}

// Stage boundaries carry fp32 (the receive buffers are fp32): a chunk that
// ran under bf16 autocast widens its output before sending it; the cast is
// part of the graph, so the fp32 gradient that comes back narrows again.
// The last chunk's output feeds the loss under autocast, as in the other
// strategies, and is kept as it is.
at::Tensor boundary(const at::Tensor& out, int model_chunk, int last_model_chunk) {
  if (model_chunk == last_model_chunk || out.scalar_type() == at::kFloat || !out.is_floating_point()) return out;
  return out.to(at::kFloat);
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

struct Held {
  at::Tensor input;   // requires grad unless it is the model's input
  at::Tensor output;  // with its graph (not kept when recomputing)
  at::Tensor loss;    // last model chunk only
  int64_t bytes = 0;
  models::RandomStates random;  // checkpoint_activations: what the forward drew from, for the recompute
};

thread_local LossRows loss_rows;  // Note [The rows of a micro-batch's loss]

// Sets loss_rows for one call of the loss.
class LossRowsScope {
 public:
  LossRowsScope(int64_t begin, int64_t count) { loss_rows = {begin, count}; }
  ~LossRowsScope() { loss_rows = {}; }
};

}  // namespace

LossRows current_loss_rows() { return loss_rows; }

namespace {

// ExecutorOptions::compute_slowdown around one forward or backward.
class SlowDown {
 public:
  explicit SlowDown(double factor) : factor_(factor), start_(std::chrono::steady_clock::now()) {}
  ~SlowDown() {
    if (factor_ > 1) std::this_thread::sleep_for((factor_ - 1) * (std::chrono::steady_clock::now() - start_));
  }
  SlowDown(const SlowDown&) = delete;
  SlowDown& operator=(const SlowDown&) = delete;

 private:
  double factor_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Executor::Executor(comm::ProcessGroup& pp, std::vector<LocalChunk> chunks, ExecutorOptions options)
    : pp_(pp), chunks_(std::move(chunks)), options_(std::move(options)),
      p2p_(pp, options_.timeout, chunks_.empty() ? c10::Device(c10::kCPU) : stage_device(*chunks_.front().module)) {
  TORCH_CHECK(!chunks_.empty(), "pipeline executor: no model chunk on this rank");
  TORCH_CHECK(options_.shape.stages == pp_.size(), "pipeline executor: schedule for ", options_.shape.stages,
              " stages on a pp group of ", pp_.size());
  TORCH_CHECK(options_.shape.virtual_stages == static_cast<int>(chunks_.size()), "pipeline executor: ",
              chunks_.size(), " local chunks but virtual_stages = ", options_.shape.virtual_stages);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    TORCH_CHECK(chunks_[i].model_chunk == static_cast<int>(i) * pp_.size() + pp_.rank(),
                "pipeline executor: local chunk ", i, " must be model chunk ", i * pp_.size() + pp_.rank());
  }
  validate_schedule(options_.schedule, options_.shape);
}

StepReport Executor::train_step(const at::Tensor& inputs, const at::Tensor& targets, const MicrobatchLoss& loss_fn,
                                const ExecutorHooks& hooks, Timeline* timeline, int64_t step) {
  const int p = pp_.size();
  const int stage = pp_.rank();
  const int m = options_.shape.microbatches;
  const int v = static_cast<int>(chunks_.size());
  const int last_model_chunk = p * v - 1;
  const int64_t rows = inputs.size(0);
  TORCH_CHECK(rows >= m, "pipeline: a batch of ", rows, " rows cannot make ", m,
              " micro-batches; lower pipeline.microbatches or raise the batch size");
  const auto input_mbs = inputs.tensor_split(m);
  const auto target_mbs = targets.tensor_split(m);
  Timeline* const rec = timeline;  // Scope records only the steps the timeline keeps
  auto prev_rank = [p](int model_chunk) { return (model_chunk - 1) % p; };
  auto next_rank = [p](int model_chunk) { return (model_chunk + 1) % p; };

  const auto actions = make_schedule(options_.schedule, options_.shape, stage);
  // Posts the receive an action will wait for (no-op when it needs none).
  auto post_input = [&](const Action& a) {
    const LocalChunk& c = chunks_[a.chunk];
    const int64_t mb_rows = input_mbs[a.microbatch].size(0);
    if (a.kind == ActionKind::kForward && c.model_chunk > 0) {
      p2p_.post_recv(prev_rank(c.model_chunk), message_tag(Payload::kActivation, c.model_chunk, a.microbatch),
                     with_rows(mb_rows, c.input_shape), c.input_dtype);
    } else if (a.kind == ActionKind::kBackward && c.model_chunk < last_model_chunk &&
               c.model_chunk >= options_.frozen_chunks) {
      p2p_.post_recv(next_rank(c.model_chunk), message_tag(Payload::kGradient, c.model_chunk, a.microbatch),
                     with_rows(mb_rows, c.output_shape), c.output_dtype);
    }
  };

  std::map<std::pair<int, int>, Held> held;  // (micro-batch, local chunk)
  std::vector<int> backwards_left(v, m);
  StepReport report;
  at::Tensor loss_sum;
  int64_t held_bytes = 0;
  // The loss of micro-batch `mb`, weighted by its share of the batch's rows:
  // the sum over micro-batches is the batch mean single-process training takes.
  std::vector<int64_t> mb_begin(static_cast<size_t>(m), 0);  // each micro-batch's first row in the batch
  for (int mb = 1; mb < m; ++mb) mb_begin[mb] = mb_begin[mb - 1] + target_mbs[mb - 1].size(0);
  auto mb_weight = [&](int mb) { return static_cast<double>(target_mbs[mb].size(0)) / static_cast<double>(rows); };
  auto weighted_loss = [&](const at::Tensor& output, int mb) {
    LossRowsScope scope(mb_begin[mb], target_mbs[mb].size(0));
    return loss_fn(output, target_mbs[mb]) * mb_weight(mb);
  };
  // While micro-batch mb's forward runs on any stage: its loss's weight in
  // the step (Note [The weight of a micro-batch's loss]), for layers that
  // add terms to the loss from inside the model; nothing when the caller
  // set none.
  auto open_weight = [&](std::optional<core::LossWeightScope>& scope, int mb) {
    if (const std::optional<double> w = core::loss_weight()) scope.emplace(*w * mb_weight(mb));
  };

  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    post_input(a);
    if (i + 1 < actions.size()) post_input(actions[i + 1]);
    const LocalChunk& c = chunks_[a.chunk];
    const int mc = c.model_chunk;
    const int mb = a.microbatch;

    if (a.kind == ActionKind::kForward) {
      at::Tensor x;
      if (mc == 0) {
        x = input_mbs[mb];
      } else {
        Timeline::Scope s(rec, {EventKind::kRecv, step, mb, a.chunk, prev_rank(mc)});
        x = p2p_.wait_recv(message_tag(Payload::kActivation, mc, mb),
                           fmt::format("activation of micro-batch {} for model chunk {}", mb, mc));
        // The chunks before a frozen prefix's end want no gradient back.
        if (mc > options_.frozen_chunks) x.requires_grad_(true);
      }
      const bool frozen = mc < options_.frozen_chunks;
      if (hooks.before_forward) hooks.before_forward(a.chunk);
      Held h;
      if (!frozen) h.input = x;
      at::Tensor out;
      {
        const SlowDown slow(options_.compute_slowdown);
        Timeline::Scope s(rec, {EventKind::kForward, step, mb, a.chunk});
        PhaseScope phase(kPhaseForward);
        core::AutocastGuard autocast(options_.autocast);
        std::optional<core::LossWeightScope> weight;
        open_weight(weight, mb);
        if (options_.checkpoint_activations || frozen) {
          if (!frozen) h.random = models::RandomStates::capture(x.device(), c.module->generators());
          torch::NoGradGuard no_grad;
          out = boundary(c.module->forward(x), mc, last_model_chunk);
          h.bytes = frozen ? 0 : bytes_of(x);
        } else {
          out = boundary(c.module->forward(x, &h.bytes), mc, last_model_chunk);
        }
        if (mc == last_model_chunk) {
          at::Tensor loss = weighted_loss(out, mb);
          loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
          if (!options_.checkpoint_activations) h.loss = loss;
        }
      }
      if (mc != last_model_chunk) {
        Timeline::Scope s(rec, {EventKind::kSend, step, mb, a.chunk, next_rank(mc), bytes_of(out)});
        p2p_.send(out, next_rank(mc), message_tag(Payload::kActivation, mc + 1, mb));
        if (!options_.checkpoint_activations && !frozen) h.output = out;
      }
      held_bytes += h.bytes;
      held.emplace(std::make_pair(mb, a.chunk), std::move(h));
      report.peak_in_flight = std::max(report.peak_in_flight, static_cast<int>(held.size()));
      report.peak_activation_bytes = std::max(report.peak_activation_bytes, held_bytes);
      continue;
    }

    auto it = held.find({mb, a.chunk});
    TORCH_CHECK(it != held.end(), "pipeline schedule ", schedule_name(options_.schedule),
                ": backward of micro-batch ", mb, " on local chunk ", a.chunk, " before its forward");
    Held h = std::move(it->second);
    held.erase(it);
    held_bytes -= h.bytes;
    const bool last_backward = --backwards_left[a.chunk] == 0;
    if (mc < options_.frozen_chunks) continue;  // a frozen prefix: nothing to compute or send
    if (hooks.before_backward) hooks.before_backward(a.chunk, last_backward);
    // BatchNorm's statistics move once per forward: put back after this
    // backward what the recompute moved (Note [Recompute in backward]).
    std::optional<models::KeepBuffers> keep;
    if (options_.checkpoint_activations) {
      Timeline::Scope s(rec, {EventKind::kRecompute, step, mb, a.chunk});
      core::AutocastGuard autocast(options_.autocast);
      // The same dropout as the forward.
      keep.emplace(c.module->buffers());
      models::count_recompute();
      std::optional<core::LossWeightScope> weight;
      open_weight(weight, mb);
      h.random.replay([&] {
        at::Tensor out = boundary(c.module->forward(h.input), mc, last_model_chunk);
        if (mc == last_model_chunk) {
          h.loss = weighted_loss(out, mb);
        } else {
          h.output = out;
        }
      });
    }
    at::Tensor grad;
    if (mc != last_model_chunk) {
      Timeline::Scope s(rec, {EventKind::kRecv, step, mb, a.chunk, next_rank(mc)});
      grad = p2p_.wait_recv(message_tag(Payload::kGradient, mc, mb),
                            fmt::format("gradient of micro-batch {} for model chunk {}", mb, mc));
    }
    {
      const SlowDown slow(options_.compute_slowdown);
      Timeline::Scope s(rec, {EventKind::kBackward, step, mb, a.chunk});
      PhaseScope phase(kPhaseBackward);
      if (mc == last_model_chunk) {
        h.loss.backward();
      } else {
        h.output.backward(grad);
      }
    }
    if (hooks.after_backward) hooks.after_backward(a.chunk, last_backward);
    if (mc > options_.frozen_chunks) {
      at::Tensor g = h.input.grad();
      TORCH_CHECK(g.defined(), "pipeline: model chunk ", mc, " produced no gradient for its input (micro-batch ", mb,
                  "): every layer must depend on its input");
      Timeline::Scope s(rec, {EventKind::kSend, step, mb, a.chunk, prev_rank(mc), bytes_of(g)});
      p2p_.send(g, prev_rank(mc), message_tag(Payload::kGradient, mc - 1, mb));
    }
  }
  TORCH_CHECK(held.empty(), "pipeline schedule ", schedule_name(options_.schedule), " left ", held.size(),
              " micro-batches without backward");
  {
    Timeline::Scope s(rec, {EventKind::kWait, step, -1, -1});
    p2p_.drain_sends();
  }
  if (rec != nullptr) rec->end_step(step);
  report.loss = loss_sum;
  return report;
}

at::Tensor Executor::forward_only(const at::Tensor& inputs) {
  torch::NoGradGuard no_grad;
  const int p = pp_.size();
  const int last_model_chunk = p * static_cast<int>(chunks_.size()) - 1;
  const int64_t rows = inputs.size(0);
  at::Tensor out;
  for (const LocalChunk& c : chunks_) {
    at::Tensor x = inputs;
    if (c.model_chunk > 0) {
      const int tag = message_tag(Payload::kActivation, c.model_chunk, kEvalMicrobatch);
      p2p_.post_recv((c.model_chunk - 1) % p, tag, with_rows(rows, c.input_shape), c.input_dtype);
      x = p2p_.wait_recv(tag, fmt::format("evaluation activation for model chunk {}", c.model_chunk));
    }
    at::Tensor y;
    {
      core::AutocastGuard autocast(options_.autocast);
      // Evaluation logits too are widened: they are broadcast as fp32.
      y = boundary(c.module->forward(x), c.model_chunk, /*last_model_chunk=*/-1);
    }
    if (c.model_chunk == last_model_chunk) {
      out = y;
    } else {
      p2p_.send(y, (c.model_chunk + 1) % p, message_tag(Payload::kActivation, c.model_chunk + 1, kEvalMicrobatch));
    }
  }
  p2p_.drain_sends();
  return out;
}

}  // namespace paratrain::pipeline

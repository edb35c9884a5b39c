// Trainer::fit's loop (fit_loop.h).
#include "paratrain/train/loop/fit_loop.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/core/gpu_memory.h"
#include "paratrain/core/loss_weight.h"
#include "paratrain/core/memory_meter.h"
#include "paratrain/core/phase.h"
#include "paratrain/optim/lr_schedule.h"
#include "paratrain/train/precision.h"
#include "paratrain/train/qat/fake_quant_model.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

FitLoop::FitLoop(Trainer& trainer, Trainer::State& s)
    : trainer_(trainer), s_(s), distill_(s), moe_(s), plan_(s),
      losses_(s.strategy->data_shard().computes, s.timeout(), s.step),
      recovery_(s, [this](const Recovery& r) {
        if (r.rolled_back) checkpoints_.restored(s_.step);  // the redone steps' checkpoints are saved again
        plan_.recount(s_);
        losses_.reset(s_.step);
      }),
      checkpoints_(s, recovery_), eval_(s.config), throughput_(s.step), schedule_(make_batch_schedule(s, plan_)),
      logger_(std::make_shared<MetricsLogger>(s, plan_)), profiler_(s), preemption_(s), freezing_(s), shares_(s) {
  result_.run_dir = s.run_dir;
  result_.global_batch = s.batch.global;
  // Note [Accumulation]
  // One optimizer step = k = train.accumulate micro-batches from the loader.
  // Each micro-batch loss is divided by k, so the summed gradients are the
  // mean over the k-times larger batch, and the last backward (sync) reduces
  // that sum across ranks: the step equals one step on the whole batch. An
  // epoch's last batches that do not fill a step are dropped, so every step
  // sees the same number of examples and the loader stands at a multiple of
  // k at every step boundary, where checkpoints are taken. k may change in
  // an in-job recovery with elastic.keep_global_batch: read from the plan.
  LossFn task_loss = distill_.wrap([task = s.task](const at::Tensor& output, const at::Tensor& targets) {
    return task->loss(output, targets);
  });
  // Unequal data.batch_shares weight each rank's loss (Note [Weighted shares]).
  micro_loss_ = [this, loss = scaled_loss(std::move(task_loss), s.scaler.get())](const at::Tensor& o,
                                                                              const at::Tensor& t) {
    const int64_t k = plan_.accumulate;
    at::Tensor out = k == 1 ? loss(o, t) : loss(o, t) / static_cast<double>(k);
    const double weight = shares_.loss_weight();
    return weight == 1.0 ? out : out * weight;
  };
  applied_lr_ = s.lr_schedule->lr(s.step);
  // First: the other callbacks see the records of the step they are told about.
  s.callbacks.insert(s.callbacks.begin(), logger_);
}

FitLoop::~FitLoop() { std::erase(s_.callbacks, std::static_pointer_cast<Callback>(logger_)); }

TrainResult FitLoop::run() {
  s_.strategy->module()->train();
  const FitInfo fit = plan_.fit_info(s_);
  s_.each_callback([&](Callback& cb) { cb.on_fit_start(fit); });
  distill_.evaluate_teacher();
  bool over = s_.step >= plan_.total_steps;
  while (!over) {
    start_epoch_if_fresh();
    if (!plan_.epoch_done(s_)) {
      const Window window = schedule_->open(plan_);
      if (train_window(window) != Outcome::kDone) continue;  // recovered: go on where the survivors stand
      if (meet(window) != Outcome::kDone) continue;          // the loss over ranks, logs, periodic checkpoint
      if (result_.preempted) break;                          // saved at this step: the process exits
      if (s_.step < plan_.total_steps) continue;
    }
    // The memory meter's peak (`paratrain plan --measure`) is training's, not
    // the last evaluation's or save's.
    if (s_.step >= plan_.total_steps) {
      core::end_memory_window();
      log_gpu_memory_peak();
    }
    const EpochEnd end = end_epoch(/*stopping=*/s_.step >= plan_.total_steps);  // evaluate, stop early, save
    over = end == EpochEnd::kFinished;
  }
  finish();
  return result_;
}

// The CUDA caching allocator's peaks, as PyTorch's max_memory_allocated and
// max_memory_reserved report them (bench/run_pytorch_gpt.sh compares them).
void FitLoop::log_gpu_memory_peak() const {
  const auto peak = core::gpu_memory_peak(s_.device);
  if (!peak) return;
  spdlog::info("peak GPU memory on {}: {:.1f} MiB allocated, {:.1f} MiB reserved (CUDA caching allocator)",
               s_.device.str(), static_cast<double>(peak->allocated) / (1 << 20),
               static_cast<double>(peak->reserved) / (1 << 20));
}

// An epoch's first step starts its own shuffle; a resumed or recovered
// position inside an epoch keeps the loader where it stands.
void FitLoop::start_epoch_if_fresh() {
  const auto at = s_.loader->state();
  if (at.next_batch == 0 && at.first_position == 0) s_.loader->set_epoch(at.epoch);
}

// This rank's steps of the window. A peer lost in a step's collectives is
// recovered (elastic.in_job) and the loop goes on from where the survivors
// stand: the failed step redone, or the restored checkpoint.
Outcome FitLoop::train_window(const Window& w) {
  const data::LoaderState at = s_.loader->state();
  int64_t line_at = s_.step;  // rank 0's last own line inside a dynamic window
  while (auto step = schedule_->next()) {
    const int64_t index = s_.step + step->in_epoch - w.first;  // the step's number in the run, from 0
    double loss = 0;
    try {
      loss = take_step(*step, index);
    } catch (const CommError& e) {
      return recovery_.recover(at, e, RecoveryPhase::kStep);  // rethrows without elastic.in_job
    }
    losses_.add(loss, static_cast<double>(shares_.own_batch()));
    report_inside_window(*step, index, w, line_at);
  }
  schedule_->close(w);
  s_.step = w.end;
  return Outcome::kDone;
}

// Forward and backward of the step's micro-batches (the last one reduces
// gradients over the ranks), then the optimizer step at the schedule's rate.
// Returns the step's mean loss on this rank.
double FitLoop::take_step(const ScheduledStep& step, int64_t index) {
  profiler_.begin_step(index + 1);
  // quant.start_step: float steps first, then fake quantization (the model
  // the strategy trains is the wrapper: builders.cpp).
  if (s_.config.quant.qat) {
    if (auto* qat = dynamic_cast<FakeQuantModel*>(s_.strategy->module().get()))
      qat->set_active(index >= s_.config.quant.start_step);
  }
  // The loss is scaled in backward (precision.loss_scale); logged unscaled.
  const double loss_scale = s_.scaler ? s_.scaler->get_scale() : 1.0;
  const int64_t k = plan_.accumulate;
  const ProfileConfig& profile = s_.config.profile;
  if (profile.test_slow_rank == s_.world->rank() && profile.test_slow_ms > 0)  // a straggler on purpose
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(profile.test_slow_ms));
  shares_.begin_step();
  // The micro-batch losses are divided by k: their sum is the step's mean.
  // Summed in double where they are and read after the optimizer step, so a
  // GPU step is queued whole before the host waits for it (Note [Clipping
  // without a sync] in optim/clip.h); 0 + l0 + l1 ... in double is what
  // adding each read value on the host gave.
  at::Tensor loss_sum;
  for (int64_t i = 0; i < k; ++i) {
    data::Batch batch;
    shares_.begin_micro_batch();
    {
      PhaseScope phase(kPhaseData);
      batch = schedule_->micro_batch(step, i);
    }
    distill_.before_micro_batch(batch.inputs);
    // What micro_loss_ multiplies the loss function's value by (the loss
    // scale, over k, times the share weight), for layers that add terms to
    // the loss from inside (Note [The weight of a micro-batch's loss]).
    const core::LossWeightScope weight(loss_scale / static_cast<double>(k) * shares_.loss_weight());
    const at::Tensor micro = s_.strategy->forward_backward(batch, micro_loss_, /*sync=*/i == k - 1).loss.to(at::kDouble);
    loss_sum = loss_sum.defined() ? loss_sum + micro.to(loss_sum.device()) : micro;
    shares_.end_micro_batch(batch.inputs.defined() ? batch.inputs.size(0) : 0);
  }
  freezing_.observe_gradients();
  applied_lr_ = s_.lr_schedule->lr(index);
  optim::set_learning_rate(*s_.optimizer, applied_lr_);
  {
    PhaseScope phase(kPhaseOptimizer);
    const bool stepped =
        s_.strategy->optimizer_step(*s_.optimizer, s_.config.optimizer.clip_grad_norm, s_.scaler.get());
    if (!stepped) ++result_.skipped_steps;
    freezing_.step_done(stepped);
    // QAT's learned activation ranges take in this step's (Note [Learned
    // activation ranges]): a collective over dp, the same step everywhere.
    if (s_.config.quant.qat && s_.config.quant.activation_bits > 0) {
      if (auto* qat = dynamic_cast<FakeQuantModel*>(s_.strategy->module().get()))
        qat->update_activation_ranges(s_.dp(), s_.timeout(), stepped);
    }
  }
  const double loss = loss_sum.item<double>();
  shares_.end_step();
  profiler_.end_step(index + 1);
  return loss / loss_scale / shares_.loss_weight();  // this rank's own mean
}

// Callbacks for a step inside a dynamic window (the window's last step is
// reported by meet(), over all ranks). Rank 0 logs its own loss every
// run.log_every steps there, without a collective (Note [Dynamic batch windows]).
void FitLoop::report_inside_window(const ScheduledStep& step, int64_t index, const Window& w, int64_t& line_at) {
  StepInfo info = step_info(index + 1, w.epoch, (step.in_epoch + 1) * plan_.accumulate);
  if (info.step >= w.end) return;
  const int64_t every = s_.config.run.log_every;
  if (s_.is_main() && every > 0 && info.step >= line_at + every) {
    info.loss = losses_.take_own_line();
    line_at = info.step;
  }
  s_.each_callback([&](Callback& cb) { cb.on_train_batch_end(info); });
}

// Where every rank stands at the same step: the loss over the ranks at a
// log point (every run.log_every steps, a checkpoint, the last step, every
// dynamic window's end), the callbacks, a periodic checkpoint, a check of
// adaptive freezing.
Outcome FitLoop::meet(const Window& w) {
  shares_.at_step_end();  // data.batch_shares: measured, logged, and "auto" moves them (batch_shares.h)
  const bool checkpoint_now = checkpoints_.periodic_due(s_.step);
  const int64_t every = s_.config.run.log_every;
  StepInfo info = step_info(s_.step, w.epoch, s_.loader->state().next_batch);
  if (!schedule_->lockstep() || (every > 0 && s_.step % every == 0) || s_.step >= plan_.total_steps ||
      checkpoint_now) {
    try {
      info.loss = result_.last_train_loss = losses_.reduce(s_.dp(), s_.step);
    } catch (const CommError& e) {
      // Every survivor took this step (its gradient all-reduce needed every
      // rank): go on after it; this line is each rank's own mean.
      const double own = losses_.own_mean();
      if (recovery_.recover(s_.loader->state(), e, RecoveryPhase::kStep) == Outcome::kRolledBack) {
        return Outcome::kRolledBack;  // this step is undone
      }
      info.loss = result_.last_train_loss = own;
    }
  }
  s_.each_callback([&](Callback& cb) { cb.on_train_batch_end(info); });
  if ((every > 0 && s_.step % every == 0) || s_.step >= plan_.total_steps) {
    distill_.log(s_.step);
    moe_.log(s_.step);
  }
  // At the run's last step the run ends here anyway: finish it (the final
  // evaluation and save) instead of leaving a preempted run with nothing left.
  if (preemption_.agreed() && s_.step < plan_.total_steps) {
    result_.preempted = true;
    result_.preempt_signal = preemption_.signal();
    return checkpoints_.save(fmt::format("preempted by {}", preempt_signal_name(preemption_.signal())));
  }
  // Freezing first: a decision saves this step with the larger frozen set,
  // and the periodic save then finds the step saved.
  if (freezing_.maybe_freeze(checkpoints_, plan_.total_steps) == Outcome::kRolledBack) return Outcome::kRolledBack;
  return checkpoint_now ? checkpoints_.save("periodic") : Outcome::kDone;
}

// The loader's epoch is done (its last whole step taken), or the run stops
// inside it (train.max_steps): epoch callbacks, an evaluation when due,
// early stopping, the next epoch's shuffle, a checkpoint.
FitLoop::EpochEnd FitLoop::end_epoch(bool stopping) {
  const int64_t epoch = s_.loader->state().epoch;
  const bool done = plan_.epoch_done(s_);  // a partial step is dropped
  if (done) result_.epochs_completed = epoch + 1;
  s_.each_callback([&](Callback& cb) { cb.on_train_epoch_end(epoch); });
  bool stop = stopping;
  if (eval_.due(epoch, done, stopping)) {
    if (evaluate(epoch) == Outcome::kRolledBack) return EpochEnd::kRolledBack;
    // Callbacks decide on the same reduced values on every rank: no vote needed.
    bool stop_early = false;
    s_.each_callback([&](Callback& cb) { stop_early = stop_early || cb.should_stop(); });
    if (stop_early && !stop) stop = result_.stopped_early = true;
  }
  const bool next = done && epoch + 1 < s_.config.train.epochs && !stop;
  if (next) s_.loader->set_epoch(epoch + 1);
  if (checkpoints_.save(done ? fmt::format("end of epoch {}", epoch + 1) : "stop") == Outcome::kRolledBack) {
    return EpochEnd::kRolledBack;
  }
  return next ? EpochEnd::kNext : EpochEnd::kFinished;
}

// Trainer::evaluate, redone on the survivors if a peer dies in it (its
// figure feeds train.monitor), then the callbacks (the logger first).
Outcome FitLoop::evaluate(int64_t epoch) {
  if (recovery_.run(RecoveryPhase::kEvaluation, [&] { result_.test = trainer_.evaluate(); }) ==
      Outcome::kRolledBack) {
    return Outcome::kRolledBack;
  }
  EvalInfo eval{.step = s_.step, .epoch = epoch, .metrics = result_.test.metrics, .count = result_.test.count};
  eval.metrics.emplace_back("train_loss", result_.last_train_loss);
  s_.each_callback([&](Callback& cb) { cb.on_validation_end(eval); });
  return Outcome::kDone;
}

StepInfo FitLoop::step_info(int64_t step, int64_t epoch, int64_t batch) const {
  StepInfo info{.step = step, .total_steps = plan_.total_steps, .epoch = epoch, .epochs = s_.config.train.epochs,
                .batch = batch, .batches = s_.loader->num_batches(), .lr = applied_lr_};
  throughput_.fill(info, plan_);
  return info;
}

void FitLoop::finish() {
  preemption_.drain();
  checkpoints_.finish();
  profiler_.finish();
  if (auto* telemetry = dynamic_cast<Telemetry*>(s_.strategy.get())) {
    for (auto& record : telemetry->final_metrics()) s_.log_record(std::move(record));
  }
  s_.each_callback([&](Callback& cb) { cb.on_fit_end(s_.step); });
  const auto at = s_.loader->state();
  result_.epochs_trained =
      at.epoch + static_cast<double>(at.next_batch) / static_cast<double>(std::max<int64_t>(s_.loader->num_batches(), 1));
  result_.steps = s_.step;
  result_.start_step = s_.start_step;
  result_.world_size = s_.world->size();
  result_.rank = s_.world->rank();
  result_.samples_per_second = throughput_.samples_per_second(s_.step, plan_.global_batch);
  result_.loss_scale = s_.scaler ? s_.scaler->get_scale() : 1.0;
  result_.last_checkpoint = checkpoints_.last();
  result_.recoveries = recovery_.recoveries();
  result_.batch_shares = s_.batch.shares;
}

}  // namespace paratrain::train

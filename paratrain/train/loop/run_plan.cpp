// Steps and batch sizes of a run (run_plan.h).
#include "paratrain/train/loop/run_plan.h"

#include <algorithm>

#include "paratrain/data/loader.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

int64_t planned_steps(const TrainConfig& c, int64_t steps_per_epoch) {
  const int64_t all = steps_per_epoch * c.train.epochs;
  return c.train.max_steps > 0 ? std::min(c.train.max_steps, all) : all;
}

RunPlan::RunPlan(const Trainer::State& s)
    : accumulate(s.batch.accumulate),
      steps_per_epoch(s.loader->num_batches() / s.batch.accumulate),
      global_batch(s.batch.global),
      total_steps(planned_steps(s.config, steps_per_epoch)) {
  if (s.loader->state().first_position > 0) recount(s);
}

void RunPlan::recount(const Trainer::State& s) {
  accumulate = s.batch.accumulate;
  global_batch = s.batch.global;
  const auto at = s.loader->state();
  // The next epochs' batches at this size: a whole epoch, not the rest of a split one.
  const int64_t full_epoch =
      data::Loader(s.datasets.train, data::DistributedSampler(s.datasets.train.size(), s.loader->sampler().options()),
                   s.loader->options())
          .num_batches();
  steps_per_epoch = full_epoch / accumulate;
  const int64_t planned = s.step + (s.loader->num_batches() - at.next_batch) / accumulate +
                          (s.config.train.epochs - at.epoch - 1) * steps_per_epoch;
  total_steps = s.config.train.max_steps > 0 ? std::min(s.config.train.max_steps, planned) : planned;
}

bool RunPlan::epoch_done(const Trainer::State& s) const {
  return s.loader->num_batches() - s.loader->state().next_batch < accumulate;
}

FitInfo RunPlan::fit_info(const Trainer::State& s) const {
  return FitInfo{.run_dir = s.run_dir, .start_step = s.start_step, .total_steps = total_steps,
                 .steps_per_epoch = steps_per_epoch, .epochs = s.config.train.epochs,
                 .global_batch = global_batch, .is_main = s.is_main()};
}

double Throughput::samples_per_second(int64_t step, int64_t global_batch) const {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  return static_cast<double>(step - first_step_) * global_batch / std::max(elapsed, 1e-9);
}

void Throughput::fill(StepInfo& info, const RunPlan& plan) const {
  info.samples_per_s = samples_per_second(info.step, plan.global_batch);
  info.eta_s = (plan.total_steps - info.step) * plan.global_batch / std::max(info.samples_per_s, 1e-9);
}

}  // namespace paratrain::train

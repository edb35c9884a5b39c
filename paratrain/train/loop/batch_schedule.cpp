// Fixed and dynamic batch schedules (batch_schedule.h).
#include "paratrain/train/loop/batch_schedule.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/train/loop/batch_items.h"
#include "paratrain/train/device_placement.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {
namespace {

// Every rank trains its DistributedSampler share, one step per window: the
// step's micro-batches are the loader's next `accumulate` batches.
class FixedSchedule final : public BatchSchedule {
 public:
  explicit FixedSchedule(Trainer::State& s) : s_(s) {}

  Window open(const RunPlan& plan) override {
    const auto at = s_.loader->state();
    pending_ = true;
    first_ = at.next_batch / plan.accumulate;
    return Window{.epoch = at.epoch, .first = first_, .steps = 1, .end = s_.step + 1};
  }
  std::optional<ScheduledStep> next() override {
    if (!pending_) return std::nullopt;
    pending_ = false;
    return ScheduledStep{.in_epoch = first_, .item = 0};
  }
  data::Batch micro_batch(const ScheduledStep&, int64_t) override {
    auto batch = s_.loader->next();
    if (!batch) {
      throw Error(fmt::format("rank {}: the loader ended epoch {} at batch {} of {}", s_.world->rank(),
                              s_.loader->state().epoch + 1, s_.loader->state().next_batch,
                              s_.loader->num_batches()));
    }
    return to_device(std::move(*batch), s_.device);
  }
  void close(const Window&) override {}  // the loader moved batch by batch
  bool lockstep() const override { return true; }

 private:
  Trainer::State& s_;
  bool pending_ = false;
  int64_t first_ = 0;
};

// Note [Dynamic batch windows]
// With dynamic batches (parameter servers, async) ranks take different
// numbers of steps, so nothing may meet all ranks mid-epoch: the epoch runs
// as windows ending where all ranks meet anyway (the epoch's end, a
// checkpoint, train.max_steps). Inside a window each rank trains the items
// the strategy hands it; a step's number is that of its item (item / dp
// size), which every rank agrees on, and the learning rate follows it.
// Mid-window log lines are rank 0's own loss (no collective: a fast worker
// must not wait for a slowed one every run.log_every steps); the window's
// end logs the mean over the ranks that train. s.step and the loader's
// position jump to the window's end on every rank, so evaluation,
// checkpoints and resume see the same position as under fixed shares.
class DynamicSchedule final : public BatchSchedule {
 public:
  explicit DynamicSchedule(Trainer::State& s) : s_(s) {}

  Window open(const RunPlan& plan) override {
    const auto at = s_.loader->state();
    const int64_t k = plan.accumulate;
    if (!epoch_items_ || epoch_ != at.epoch) {
      epoch_items_.emplace(s_.datasets.train.size(), s_.loader->sampler().options(), at.epoch, s_.batch.per_rank, k);
      epoch_ = at.epoch;
    }
    Window w{.epoch = at.epoch, .first = at.next_batch / k};
    w.steps = dynamic_window_steps(w.first, plan.steps_per_epoch, s_.step, plan.total_steps,
                                   s_.config.train.checkpoint_every_steps);
    w.end = s_.step + w.steps;
    items().begin_window(w.first, w.steps);
    return w;
  }
  std::optional<ScheduledStep> next() override {
    const int64_t item = items().next_item();
    if (item < 0) return std::nullopt;
    return ScheduledStep{.in_epoch = item / s_.strategy->data_shard().size, .item = item};
  }
  data::Batch micro_batch(const ScheduledStep& step, int64_t i) override {
    // Servers train nothing: they get no rows.
    if (!s_.strategy->data_shard().computes) return data::Batch{};
    return to_device(data::gather(s_.datasets.train, epoch_items_->rows(step.item, i)), s_.device);
  }
  void close(const Window& w) override {
    s_.loader->load_state({w.epoch, (w.first + w.steps) * s_.batch.accumulate});
  }
  bool lockstep() const override { return false; }

 private:
  // Looked up each time: the strategy is the State's (rebuilt when the world changes).
  DynamicBatches& items() { return *facet<DynamicBatches>(*s_.strategy); }

  Trainer::State& s_;
  std::optional<EpochItems> epoch_items_;
  int64_t epoch_ = -1;
};

}  // namespace

int64_t dynamic_window_steps(int64_t first, int64_t steps_per_epoch, int64_t step, int64_t total_steps,
                             int64_t checkpoint_every) {
  int64_t steps = std::min(steps_per_epoch - first, total_steps - step);
  if (checkpoint_every > 0) steps = std::min(steps, checkpoint_every - step % checkpoint_every);
  return steps;
}

std::unique_ptr<BatchSchedule> make_batch_schedule(Trainer::State& s, const RunPlan& plan) {
  auto* items = facet<DynamicBatches>(*s.strategy);
  if (!items) return std::make_unique<FixedSchedule>(s);
  items->begin_run(std::max<int64_t>(plan.total_steps - s.step, 0));
  if (!items->dynamic_batches()) return std::make_unique<FixedSchedule>(s);
  return std::make_unique<DynamicSchedule>(s);
}

}  // namespace paratrain::train

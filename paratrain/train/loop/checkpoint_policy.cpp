// When the loop saves, and what follows a save (checkpoint_policy.h).
#include "paratrain/train/loop/checkpoint_policy.h"

#include <optional>

#include <spdlog/spdlog.h>

#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/train/recovery/in_job.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

CheckpointPolicy::CheckpointPolicy(Trainer::State& s, InJobRecovery& recovery)
    : s_(s), recovery_(recovery), saved_step_(s.start_step > 0 ? s.start_step : -1) {}

bool CheckpointPolicy::periodic_due(int64_t step) const {
  const int64_t every = s_.config.train.checkpoint_every_steps;
  return every > 0 && step % every == 0;
}

Outcome CheckpointPolicy::save(const std::string& why) {
  if (s_.step == saved_step_) return Outcome::kDone;
  saved_step_ = s_.step;
  std::optional<SavedCheckpoint> done;
  // Rank 0 clears a failed attempt's directory before the redo (sharded_writer.cpp).
  const Outcome outcome = recovery_.run(RecoveryPhase::kCheckpoint, [&] {
    const auto at = s_.loader->state();
    const LoopPosition position{
        .step = s_.step, .epoch = at.epoch, .next_batch = at.next_batch,
        .consumed_positions =
            consumed_positions(at, s_.loader->positions_per_batch()),
        .batch_shares = s_.batch.shares};
    done = s_.checkpointer->save(s_.run_dir, s_.config, *s_.strategy, *s_.optimizer, position, s_.scaler.get(), why);
  });
  if (done) committed(*done);
  return outcome;
}

void CheckpointPolicy::finish() {
  if (auto done = s_.checkpointer->finish()) committed(*done);
}

void CheckpointPolicy::committed(const SavedCheckpoint& done) {
  last_ = done.dir;
  if (s_.is_main()) spdlog::info("checkpoint {} ({})", done.dir.string(), done.why);
  // Before pruning: the best checkpoint's link must be in place to be spared.
  s_.each_callback([&](Callback& cb) { cb.on_checkpoint(done.step, done.dir); });
  if (s_.is_main() && s_.config.train.keep_checkpoints > 0) {
    checkpoint::prune_checkpoints(s_.run_dir, s_.config.train.keep_checkpoints);
  }
}

}  // namespace paratrain::train

// CheckpointPolicy: when the loop saves and what follows a save. Periodic
// checkpoints (train.checkpoint_every_steps), one at each epoch's end and at
// a stop; a step is never saved twice (a resumed run does not rewrite the
// checkpoint it started from). With train.async_checkpoint a checkpoint
// counts only once its background write is done (the next save or finish()
// waits for it): then it is logged, handed to the callbacks (the best
// checkpoint's link) and the old ones are pruned (train.keep_checkpoints).
// Not the format (checkpoint/) nor what a rank holds (the strategy).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "paratrain/train/checkpointing.h"
#include "paratrain/train/loop/recovery.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

class CheckpointPolicy {
 public:
  CheckpointPolicy(Trainer::State& s, InJobRecovery& recovery);

  // train.checkpoint_every_steps divides `step`.
  bool periodic_due(int64_t step) const;
  // Saves the loop's position (s.step, the loader) unless that step is saved
  // already. Collective. A peer dying inside it is recovered and the save
  // redone at the new world size (its failed attempt left no index.json);
  // kRolledBack when the survivors restored a checkpoint instead.
  Outcome save(const std::string& why);
  // After a rollback to the checkpoint of `step`: it is on disk, and the
  // redone steps after it save anew.
  void restored(int64_t step) { saved_step_ = step; }
  // End of fit: waits for a background save in flight. Collective.
  void finish();
  // The newest checkpoint known to be complete (empty when none).
  const std::filesystem::path& last() const { return last_; }

 private:
  void committed(const SavedCheckpoint& done);

  Trainer::State& s_;
  InJobRecovery& recovery_;
  int64_t saved_step_;
  std::filesystem::path last_;
};

}  // namespace paratrain::train

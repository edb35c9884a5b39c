// InJobRecovery: the loop's side of elastic.in_job. When a collective fails
// because a peer died, the survivors re-form the world (train/recovery/in_job.h) and
// this object tells the loop where to go on: redo the failed step, or, when
// they rolled back to a checkpoint (sharded strategies), continue from the
// restored position that s.step and the loader now hold. Without
// elastic.in_job every failure is rethrown. No exception crosses the loop
// as control flow: callers get an Outcome.
#pragma once

#include <cstdint>
#include <functional>

#include "paratrain/data/loader.h"
#include "paratrain/train/recovery/in_job.h"
#include "paratrain/train/trainer.h"

namespace paratrain::train {

enum class Outcome {
  kDone,        // it ran (after a recovery, on the new world)
  kRedo,        // the survivors stand where the failed step started: take it again
  kRolledBack,  // the survivors restored a checkpoint: go on from s.step and the loader
};

class InJobRecovery {
 public:
  // `recovered` runs after every recovery, with the world and loader
  // already re-formed (the loop recounts its plan and forgets its losses).
  InJobRecovery(Trainer::State& s, std::function<void(const Recovery&)> recovered);

  // Call from the catch block of a CommError (rethrows it without
  // elastic.in_job). `at`: the loader's state when the failed work started.
  Outcome recover(const data::LoaderState& at, const std::exception& failure, RecoveryPhase phase);

  // Runs `op` (an evaluation or a checkpoint save, taken at a step boundary)
  // and, when a peer dies inside it, redoes it on the re-formed world: its
  // figure feeds train.monitor, and a save must land. After a rollback the
  // operation belonged to undone steps and is dropped (kRolledBack).
  Outcome run(RecoveryPhase phase, const std::function<void()>& op);

  int64_t recoveries() const { return recoveries_; }

 private:
  Trainer::State& s_;
  std::function<void(const Recovery&)> recovered_;
  int64_t recoveries_ = 0;
};

}  // namespace paratrain::train

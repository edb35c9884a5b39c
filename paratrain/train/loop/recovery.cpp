// The loop's side of in-job recovery (recovery.h).
#include "paratrain/train/loop/recovery.h"

#include "paratrain/core/error.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

InJobRecovery::InJobRecovery(Trainer::State& s, std::function<void(const Recovery&)> recovered)
    : s_(s), recovered_(std::move(recovered)) {}

Outcome InJobRecovery::recover(const data::LoaderState& at, const std::exception& failure, RecoveryPhase phase) {
  if (!s_.rejoiner) throw;  // the CommError being handled
  const Recovery r = recover_in_job(s_, at, failure, phase);
  ++recoveries_;
  recovered_(r);
  return r.rolled_back ? Outcome::kRolledBack : Outcome::kRedo;
}

Outcome InJobRecovery::run(RecoveryPhase phase, const std::function<void()>& op) {
  for (;;) {
    try {
      op();
      return Outcome::kDone;
    } catch (const CommError& e) {
      // Both run at a step boundary: the loader's state is where every survivor stands.
      if (recover(s_.loader->state(), e, phase) == Outcome::kRolledBack) return Outcome::kRolledBack;
    }
  }
}

}  // namespace paratrain::train

// try_load_training_checkpoint: see load_attempt.h.
#include "paratrain/train/recovery/load_attempt.h"

#include "paratrain/checkpoint/checkpoint_access.h"
#include "paratrain/core/error.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

LoadAttempt try_load_training_checkpoint(const std::filesystem::path& path, Trainer::State& s) {
  LoadAttempt out;
  try {
    out.position = load_training_checkpoint(path, *s.strategy, *s.optimizer, s.scaler.get());
  } catch (const checkpoint::CheckpointAccessError& e) {
    out.error = e.what();
    out.denied = true;
  } catch (const CheckpointError& e) {
    out.error = e.what();
  }
  return out;
}

}  // namespace paratrain::train

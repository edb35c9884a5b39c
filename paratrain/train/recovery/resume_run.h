// Where a run starts: from scratch, or from a checkpoint (train.resume),
// with the loader placed at the checkpoint's position in its epoch at this
// run's world size and batch, and every rank checked to stand at the same
// place. Not the checkpoint format (checkpoint/) nor which checkpoint
// `auto` means (checkpointing.h: resume_candidates).
#pragma once

#include "paratrain/train/trainer.h"

namespace paratrain::train {

// Resumes `s` when train.resume asks for it (s.step and the loader follow
// the checkpoint; s.start_step is where this process starts). Refuses a
// fresh start in a run directory that holds checkpoints. Collective over
// s.world; throws CheckpointError when the ranks cannot agree on a
// checkpoint or a position.
void resume_or_start(Trainer::State& s);

}  // namespace paratrain::train

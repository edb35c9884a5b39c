// In-job recovery of the sharded strategies (elastic.in_job with zero.stage
// 1-3: ZeRO-1/2 and FSDP): the survivors roll back to the latest complete
// checkpoint of the run, resharded to their number, or to the run's start
// when none was taken yet, in the same processes. Called by
// recover_in_job (in_job.h) once the new world and mesh stand; the DDP path,
// which redoes only the failed step from memory, is there too.
// Not here: the membership round (comm/rejoin.h), the loader's new split
// and the recovery record (in_job.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

// True when elastic.in_job must roll back instead of redoing the failed
// step from memory: some of a rank's state (its optimizer shard; under
// FSDP its parameter shard too) is held by that rank alone (zero.stage > 0).
// See Note [Why sharded runs roll back] in in_job_rollback.cpp.
bool rolls_back_in_job(const TrainConfig& config);

// The point the survivors went back to.
struct RolledBack {
  int64_t step = 0;                  // optimizer steps done there
  int64_t epoch = 0;                 // the loader's epoch there
  int64_t consumed_positions = 0;    // of that epoch's permutation (Note [Consumed samples] in in_job.cpp)
  std::filesystem::path checkpoint;  // empty: the run's start, re-initialized from run.seed
  std::string what;                  // "rolled back to checkpoint step 40", for the log and metrics.jsonl
};

// Replaces s.strategy (built over s.mesh, which must already be the new
// world's), s.optimizer and s.scaler with fresh ones, restores them from the
// newest checkpoint of this run taken since this process started (resharded
// to the new world size), or keeps the fresh model when there is none and the
// run started at step 0, and sets s.step. The loader is left to the caller.
// Collective over s.world. Throws CheckpointError when the survivors see
// different checkpoints (no shared run directory) or none of them loads on
// every survivor and the run did not start at step 0.
RolledBack roll_back_in_job(Trainer::State& s);

}  // namespace paratrain::train

// In-job recovery (elastic.in_job): when a peer dies in the middle of
// training, the surviving ranks abort the world group, meet in a membership
// round of the store (comm/rejoin.h), and rebuild over the new world what
// spans it (mesh, strategy wrapper, checkpointer, loader). DDP keeps the
// model and optimizer state each replica holds in memory and redoes the
// failed step; ZeRO-1/2 and FSDP roll back to the latest complete checkpoint
// (or the run's start), resharded to the survivors (in_job_rollback.h).
// Pipeline, tensor/context parallel and parameter-server runs are refused
// (world_section.cpp).
// Not here: the decision to recover (the loop catches the CommError of a
// collective and asks train/loop/recovery.h) and the round itself
// (comm/rejoin.cpp).
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "paratrain/data/loader.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

// What the survivors were doing when the failure hit: they must all redo
// the same thing (check_survivors_agree in in_job.cpp).
enum class RecoveryPhase { kStep = 0, kEvaluation = 1, kCheckpoint = 2 };

struct Recovery {
  int old_world_size = 0;
  int world_size = 0;
  std::vector<int> dead_ranks;  // ranks of the old world
  int64_t first_position = 0;   // where the survivors' share of the epoch starts
  double seconds = 0;           // failure caught -> new world ready
  // What the survivors continue from: DDP keeps its memory and redoes the
  // failed step; the sharded strategies roll back (in_job_rollback.h).
  bool rolled_back = false;
  int64_t restored_step = 0;    // optimizer steps done at the point they continue from
  std::string restored;         // "rolled back to checkpoint step 40", for the log and metrics.jsonl
  // elastic.keep_global_batch: the per-rank batch and train.accumulate
  // before and after (equal when nothing changed).
  BatchSizes old_batch, batch;
};

// Positions [0, result) of the epoch's permutation were trained when every
// rank's loader stands at `at` (Note [Consumed samples] in in_job.cpp).
int64_t consumed_positions(const data::LoaderState& at, int64_t per_rank_batch, int64_t replicas);
// The same for a loader standing at `at`, a batch of every rank covering
// `positions_per_batch` positions (data::Loader::positions_per_batch).
inline int64_t consumed_positions(const data::LoaderState& at, int64_t positions_per_batch) {
  return at.first_position + at.next_batch * positions_per_batch;
}

// Re-forms the world and puts the loader at `resume_at` (the loader's state
// at the last point where every survivor had completed the same steps: the
// start of the failed step, which is then redone). The positions of the
// epoch's permutation before it count as consumed; the rest, the dead
// rank's share included, is split among the survivors. Collective among the
// survivors; throws CommError when they disagree on the step they stand at
// (one completed the failed step's all-reduce, another did not), or when
// this rank is left out of the new membership, or when they were in
// different phases (one in the failed step, another in a checkpoint save
// it had not reached). `phase`: what this rank redoes after it (a step, an
// evaluation, a checkpoint save). With elastic.keep_global_batch the
// per-rank batch (or train.accumulate) changes so the global batch stays
// (a ConfigError when neither divides, as for a restarted generation).
// With a rollback (rolls_back_in_job) `resume_at` and `phase` are not used:
// s.step, the epoch and the loader's position become the restored
// checkpoint's, which may lie in an earlier epoch than the failure (the
// caller's loop follows s.loader->state().epoch), and the survivors need not
// agree on the step or phase (every one discards where it stood).
Recovery recover_in_job(Trainer::State& s, const data::LoaderState& resume_at, const std::exception& failure,
                        RecoveryPhase phase = RecoveryPhase::kStep);

}  // namespace paratrain::train

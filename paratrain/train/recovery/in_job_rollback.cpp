// In-job rollback of the sharded strategies (in_job_rollback.h).
#include "paratrain/train/recovery/in_job_rollback.h"

#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/checkpoint/checkpoint_access.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/core/error.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/precision.h"
#include "paratrain/train/recovery/load_attempt.h"
#include "paratrain/train/strategies/strategy_registry.h"

namespace paratrain::train {

// Note [Why sharded runs roll back]
// Under ZeRO-1/2 every rank holds the whole model (the all-gather after each
// step), but each rank steps and keeps only its shard of the optimizer state
// (momentum, Adam moments, step counts); under FSDP (stage 3) the parameters
// themselves are shards between uses. A dead rank's shard of that state
// exists on no survivor. The survivors could go on from their memory with the
// ZeRO-1/2 parameters and a zeroed optimizer state for the lost slice, but
// that is a different run (momentum restarts on a third of the parameters)
// and differs from every run one process could train. So the survivors throw
// their state away and restore all of it from the newest complete
// checkpoint, which any layout loads at any world size (a sharded checkpoint
// records global shapes, checkpoint/sharded.h): the result is exactly
// the run resumed from that checkpoint on the survivors, and the steps since
// it are redone. Nothing held in memory is used but the datasets, the config
// and the learning-rate schedule (a function of the step). Before the first
// checkpoint the run's start is the newest state every survivor can rebuild:
// the model drawn again from run.seed (what the Trainer did at its start;
// keeping a copy of the initial weights instead would cost every rank the
// whole model's memory for the run's life, which FSDP exists to avoid) and a
// fresh optimizer. With an optimizer without state (SGD, momentum 0) ZeRO-1/2
// could go on from memory; that is not done: one path, exact for every
// optimizer, and tested.
bool rolls_back_in_job(const TrainConfig& config) { return config.zero.stage > 0; }

namespace {

// A fresh strategy over the new mesh, its model drawn from run.seed, a fresh
// optimizer over its shards and a fresh loss scaler: the run's start, as the
// Trainer built it (trainer.cpp), at the new world size. Collective (the
// strategy wrapper's broadcast).
void rebuild_at_start(Trainer::State& s) {
  // The optimizer's tensors are the old strategy's shards: both go, the
  // optimizer first, before the new ones take memory.
  s.optimizer.reset();
  s.strategy.reset();
  build_model_and_optimizer(s);
}

// The checkpoints a rollback may restore, newest first: those of this run
// directory taken since this process started (with train.resume = "auto"
// the one it started from is among them), then an explicit train.resume
// path (the run's start when it came from elsewhere).
std::vector<std::pair<int64_t, std::filesystem::path>> candidates(const Trainer::State& s) {
  std::vector<std::pair<int64_t, std::filesystem::path>> out;
  for (const auto& entry : checkpoint::list_checkpoints(s.run_dir)) {
    if (entry.step >= s.start_step) out.emplace_back(entry.step, entry.path);
  }
  const auto& resume = s.config.train.resume;
  if (!resume.empty() && resume != "auto") out.emplace_back(s.start_step, resume);
  return out;
}

// The same value on every rank: min and max over the world agree.
std::pair<int64_t, int64_t> min_max(comm::ProcessGroup& world, int64_t value, std::chrono::milliseconds timeout) {
  auto lo = torch::tensor({static_cast<double>(value)}, torch::kDouble);
  auto hi = lo.clone();
  world.all_reduce(lo, comm::ReduceOp::kMin)->wait(timeout);
  world.all_reduce(hi, comm::ReduceOp::kMax)->wait(timeout);
  return {lo.item<int64_t>(), hi.item<int64_t>()};
}

}  // namespace

RolledBack roll_back_in_job(Trainer::State& s) {
  auto& world = *s.world;
  const auto list = candidates(s);
  rebuild_at_start(s);
  // Every survivor must restore the same step, or they would train
  // different models and issue different collectives: they walk the list
  // together and agree on each candidate's step first.
  for (size_t i = 0;; ++i) {
    const int64_t mine = i < list.size() ? list[i].first : -1;
    const auto [lo, hi] = min_max(world, mine, s.timeout());
    if (lo != hi) {
      throw CheckpointError(fmt::format(
          "rank {}: in-job recovery: the survivors see different checkpoints to roll back to (step {} on one, "
          "{} on another): every rank must read the same run directory {}; put it on a shared filesystem",
          world.rank(), lo, hi, s.run_dir.string()));
    }
    if (mine < 0) {
      if (s.start_step > 0) {
        throw CheckpointError(fmt::format(
            "rank {}: in-job recovery: no checkpoint of this run could be loaded on every survivor, and the run "
            "started from one at step {} ({}): nothing to roll back to. Restart it with train.resume=auto",
            world.rank(), s.start_step, s.config.train.resume));
      }
      if (i > 0) rebuild_at_start(s);  // a failed load may have filled part of the state
      s.step = 0;
      RolledBack start;  // step, epoch and position 0, no checkpoint
      start.what = "rolled back to the run's start (step 0; no checkpoint yet): the model re-initialized from "
                   "run.seed, a fresh optimizer";
      return start;
    }
    const auto& path = list[i].second;
    auto [position, error, denied] = try_load_training_checkpoint(path, s);
    // One collective for both verdicts: loaded everywhere, readable everywhere.
    auto ok = torch::tensor({position ? 1 : 0, denied ? 0 : 1}, torch::kInt);
    world.all_reduce(ok, comm::ReduceOp::kMin)->wait(s.timeout());
    if (ok[1].item<int>() == 0) {
      // Not damaged, and perhaps the newest good state: neither moved aside
      // nor passed over for an older one; the permissions are the user's to fix.
      throw checkpoint::CheckpointAccessError(
          denied ? fmt::format("{} (in-job recovery: nothing was moved aside)", error)
                 : fmt::format("rank {}: in-job recovery: another survivor may not read checkpoint {}; see its log "
                               "(nothing was moved aside)",
                               world.rank(), path.string()));
    }
    if (ok[0].item<int>() == 1) {
      s.step = position->step;
      return RolledBack{.step = position->step, .epoch = position->epoch,
                        .consumed_positions = position->consumed_positions, .checkpoint = path,
                        .what = fmt::format("rolled back to checkpoint step {}", position->step)};
    }
    spdlog::warn("rank {}: in-job recovery: skipping checkpoint {}: {}", world.rank(), path.string(),
                 error.empty() ? "another survivor could not load it" : error);
    // Every survivor is past reading it (the collective above). Out of the
    // way, as a resume does, so that no later rollback or train.resume =
    // auto picks it. (Only this run's own: never the checkpoint it started
    // from.)
    if (world.rank() == 0 && list[i].first > s.start_step) {
      try {
        quarantine_checkpoint(path);
      } catch (const CheckpointError& e) {
        spdlog::warn("{}", e.what());
      }
    }
    rebuild_at_start(s);
  }
}

}  // namespace paratrain::train

// Where a run starts (resume_run.h).
#include "paratrain/train/recovery/resume_run.h"

#include <torch/torch.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/checkpoint/checkpoint_access.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/freeze/refreeze.h"
#include "paratrain/train/loop/batch_shares.h"
#include "paratrain/train/recovery/load_attempt.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {
namespace {

// Every rank must start from the same position, or they would issue
// different numbers of collectives and hang: catches ranks that resumed from
// different checkpoints (no shared filesystem) or none. Collective.
void check_ranks_agree_on_position(comm::ProcessGroup& world, int64_t step, const data::LoaderState& loader,
                                   std::chrono::milliseconds timeout) {
  if (world.size() == 1) return;
  auto mine = torch::tensor({static_cast<double>(step), static_cast<double>(loader.epoch),
                             static_cast<double>(loader.next_batch)}, torch::kDouble);
  auto lo = mine.clone();
  auto hi = mine.clone();
  world.all_reduce(lo, comm::ReduceOp::kMin)->wait(timeout);
  world.all_reduce(hi, comm::ReduceOp::kMax)->wait(timeout);
  if (!torch::equal(lo, hi)) {
    throw CheckpointError(fmt::format(
        "rank {}: ranks start from different positions (step {} to {}); every rank must resume from the "
        "same checkpoint: put the run directory on a shared filesystem or pass train.resume=<path> "
        "readable by all ranks",
        world.rank(), lo[0].item<int64_t>(), hi[0].item<int64_t>()));
  }
}

// True on every rank when `ok` is true on every rank. Collective.
bool all_ranks(comm::ProcessGroup& world, bool ok, std::chrono::milliseconds timeout) {
  auto flag = torch::tensor({ok ? 1 : 0}, torch::kInt);
  world.all_reduce(flag, comm::ReduceOp::kMin)->wait(timeout);
  return flag.item<int>() == 1;
}

// freeze.adaptive: what earlier checks of the run froze stays frozen. The
// checkpoint records its frozen set; when that holds more than this run's
// freeze.modules, the strategy is rebuilt with the union and the checkpoint
// loaded again (refreeze.h). Every rank reads the same checkpoint.
void keep_adaptively_frozen(Trainer::State& s, const std::filesystem::path& path) {
  if (!s.config.freeze.adaptive) return;
  std::vector<std::string> modules = s.config.freeze.modules;
  std::vector<std::string> added;
  for (const std::string& m : checkpoint_frozen_modules(path)) {
    if (std::find(modules.begin(), modules.end(), m) != modules.end()) continue;
    modules.push_back(m);
    added.push_back(m);
  }
  if (added.empty()) return;
  if (s.is_main()) {
    spdlog::info("freeze.adaptive: {} froze [{}] before it was saved; they stay frozen", path.string(),
                 fmt::join(added, ", "));
  }
  refreeze(s, std::move(modules), path);
}

// Loads the first candidate that every rank can load (train.resume = "auto"
// falls back from a corrupt newest checkpoint to the previous one); a
// checkpoint that some rank cannot read is skipped by all ranks together.
// Returns the position, or nullopt when there was nothing to resume.
std::optional<LoopPosition> resume(Trainer::State& s) {
  const auto candidates = resume_candidates(s.config, s.run_dir);
  if (candidates.empty()) {
    if (s.config.train.resume == "auto" && s.is_main()) {
      spdlog::info("train.resume = auto: no complete checkpoint in {}; starting fresh",
                   (s.run_dir / "checkpoints").string());
    }
    return std::nullopt;
  }
  std::string last_error;
  for (const auto& path : candidates) {
    auto [position, error, denied] = try_load_training_checkpoint(path, s);
    if (!error.empty()) last_error = error;
    if (!all_ranks(*s.world, position.has_value(), s.timeout())) {
      const bool any_denied = !all_ranks(*s.world, !denied, s.timeout());
      if (s.config.train.resume != "auto" || any_denied) {
        throw CheckpointError(error.empty()
                                  ? fmt::format("rank {}: another rank could not {} {}; see its log",
                                                s.world->rank(), any_denied ? "read" : "load", path.string())
                                  : error);
      }
      spdlog::warn("rank {}: skipping checkpoint {}: {}", s.world->rank(), path.string(),
                   error.empty() ? "another rank could not load it" : error);
      // Every rank is past reading it (the collective above). Keep it for a
      // post-mortem, out of the way of the step the continued run will save
      // (Note [Damaged checkpoints move aside] in checkpointing.cpp).
      if (s.is_main()) quarantine_checkpoint(path);
      continue;
    }
    if (s.is_main()) {
      spdlog::info("resumed from {} at epoch {}, batch {}, step {}", path.string(), position->epoch + 1,
                   position->next_batch, position->step);
    }
    keep_adaptively_frozen(s, path);
    return position;
  }
  throw CheckpointError(fmt::format("train.resume = auto: no checkpoint in {} could be loaded (last error: {}); "
                                    "set train.resume = \"\" and pick another run.name to start fresh",
                                    (s.run_dir / "checkpoints").string(), last_error));
}

// data.batch_shares = "auto" goes on with the shares the checkpoint was
// taken with when they fit this run (the same dp size and batch); an
// explicit vector is the user's word. Either reads the same global batches
// (Note [Shared global batches] in data/sampler.cpp).
void continue_batch_shares(Trainer::State& s, const std::vector<int64_t>& saved) {
  if (!s.config.data.auto_shares() || saved.empty() || saved == s.batch.shares) return;
  int64_t total = 0;
  for (int64_t b : saved) total += b;
  if (saved.size() != s.batch.shares.size() || total != s.batch.per_rank * static_cast<int64_t>(saved.size())) {
    if (s.is_main()) {
      spdlog::info("data.batch_shares = auto: the checkpoint's shares [{}] are for another dp size or batch; "
                   "starting equal",
                   fmt::join(saved, ", "));
    }
    return;
  }
  apply_batch_shares(s, saved);
}

}  // namespace

void resume_or_start(Trainer::State& s) {
  const auto& c = s.config;
  // Resume before writing anything: a bad checkpoint must fail the run
  // without touching the run directory.
  // Leftovers of an interrupted save are removed before any rank lists the
  // checkpoints (the barrier), and never while a save could be running.
  if (!c.train.resume.empty()) {
    if (s.is_main()) checkpoint::clean_interrupted_checkpoints(s.run_dir);
    s.world->barrier()->wait(s.timeout());
  }
  if (auto position = resume(s)) {
    s.step = position->step;
    continue_batch_shares(s, position->batch_shares);
    // Note [Resuming at another world size]
    // A checkpoint records the epoch's consumed positions (the sampler's
    // permutation trained so far: first_position + next_batch x the positions
    // a batch of every rank covers, per-rank batch x replicas or the sum of
    // data.batch_shares). When this run's ranks and batch reach the same place in
    // whole batches, the batch count resumes as before; otherwise (a world
    // size or per-rank batch that changed since: an elastic restart at a new
    // size without elastic.keep_global_batch, or after an in-job recovery)
    // the loader starts the rest of the epoch at that position, split over
    // this run's ranks, so no sample is skipped or repeated.
    const int64_t per_step_now = s.loader->positions_per_batch();
    if (position->consumed_positions > 0 && position->consumed_positions != position->next_batch * per_step_now) {
      if (position->consumed_positions >= s.loader->sampler().dataset_size()) {
        // Saved at its epoch's end: end this split's epoch there too.
        s.loader->load_state({position->epoch, 0});
        s.loader->load_state({position->epoch, s.loader->num_batches()});
      } else {
        s.loader->load_state({position->epoch, 0, position->consumed_positions});
      }
    } else {
      s.loader->load_state({position->epoch, position->next_batch});
    }
  } else if (c.train.resume.empty() && !checkpoint::list_checkpoints(s.run_dir).empty()) {
    throw ConfigError(fmt::format("the run directory {} already holds checkpoints of an earlier run; set "
                                  "train.resume=auto to continue it, or run.version=-1 to start a new version",
                                  s.run_dir.string()));
  }
  s.start_step = s.step;
  check_ranks_agree_on_position(*s.world, s.step, s.loader->state(), s.timeout());
}

}  // namespace paratrain::train

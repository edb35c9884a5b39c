// Batch sizes after an in-job recovery: see in_job_batch.h.
#include "paratrain/train/recovery/in_job_batch.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train {

// Note [Keeping the global batch in the job]
// The same rule as a restarted generation's (Note [Keeping the global batch]
// in restart_resume.cpp, keep_global_batch_over): the per-rank batch
// G / (dp * accumulate) when it divides, else train.accumulate
// G / (dp * per-rank batch). G is the global batch the failed world trained
// with, which is the starting one when every earlier recovery kept it too.
// What stays exact around it:
// - the data: a step of dp ranks with per-rank batch b and k micro-batches
//   trains the next dp * b * k positions of the epoch's permutation (strided
//   split, Note [Strided split] in data/sampler.cpp), whatever dp, b and k
//   are, so the survivors' steps train the same samples, in the same groups,
//   as the undisturbed job's steps would have;
// - the loss: every rank's micro-batch has the same size b, so the mean of
//   the ranks' means (over k micro-batches, Note [Accumulation] in
//   train/loop/fit_loop.cpp) is the mean over the step's G samples;
// - the schedule: steps per epoch and the steps left stay, so the learning
//   rate of step s is the one planned.
RecoveredBatch batch_after_recovery(const TrainConfig& config, const BatchSizes& now, int old_dp, int new_dp) {
  RecoveredBatch out;
  if (!config.elastic.keep_global_batch) {
    out.sizes = now;
    out.sizes.global = now.per_rank * new_dp * now.accumulate;
    if (out.sizes.global != now.global) {
      out.message = fmt::format("global batch {} -> {} (per-rank batch {} kept; elastic.keep_global_batch = true "
                                "keeps the global batch instead)",
                                now.global, out.sizes.global, now.per_rank);
    }
    return out;
  }
  const auto kept = keep_global_batch_over(now, new_dp);
  if (!kept) {
    throw ConfigError(fmt::format(
        "elastic.keep_global_batch = true: in-job recovery from dp {} to dp {} cannot keep the global batch {}: "
        "it does not divide over dp {} with train.accumulate {} nor with the per-rank batch {}; set "
        "data.global_batch_size to a multiple of every dp size the job may run at, or "
        "elastic.keep_global_batch = false",
        old_dp, new_dp, now.global, new_dp, now.accumulate, now.per_rank));
  }
  out.sizes = *kept;
  if (kept->per_rank != now.per_rank) {
    out.message = fmt::format("elastic.keep_global_batch: dp {} -> {}: per-rank batch {} -> {} (train.accumulate {}), "
                              "global batch {} kept",
                              old_dp, new_dp, now.per_rank, kept->per_rank, kept->accumulate, kept->global);
  } else if (kept->accumulate != now.accumulate) {
    out.message = fmt::format("elastic.keep_global_batch: dp {} -> {}: the per-rank batch {} cannot be split evenly, "
                              "so train.accumulate {} -> {}; global batch {} kept",
                              old_dp, new_dp, now.per_rank, now.accumulate, kept->accumulate, kept->global);
  }
  return out;
}

}  // namespace paratrain::train

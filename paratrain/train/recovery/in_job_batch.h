// The batch sizes an in-job recovery (in_job.h) goes on with at the new
// world size: the per-rank batch kept (the global batch shrinks or grows
// with the world), or with elastic.keep_global_batch the global batch kept
// by changing the per-rank batch or train.accumulate. Pure arithmetic and
// the log line; the loader and the loop apply it (in_job.cpp, train/loop/).
#pragma once

#include <string>

#include "paratrain/train/batch_size.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train {

struct RecoveredBatch {
  BatchSizes sizes;
  std::string message;  // what changed, for the log; empty when nothing did
};

// `now`: the sizes the failed world trained with over `old_dp` ranks.
// Throws ConfigError naming elastic.keep_global_batch and the sizes when the
// option is on and neither the per-rank batch nor train.accumulate can make
// the global batch at `new_dp`.
RecoveredBatch batch_after_recovery(const TrainConfig& config, const BatchSizes& now, int old_dp, int new_dp);

}  // namespace paratrain::train

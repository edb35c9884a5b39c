// GPipe (Huang et al., arXiv 1811.06965): every micro-batch forward, then
// every micro-batch backward. The naive twin of 1F1B: same bubble, but all m
// micro-batches' activations stay alive until the first backward.
#include "paratrain/pipeline/schedule.h"

namespace paratrain::pipeline {

std::vector<Action> gpipe_schedule(const ScheduleOptions& options, int stage) {
  validate_schedule(ScheduleKind::kGpipe, options);
  validate_stage(options, stage);
  const int m = options.microbatches;
  std::vector<Action> actions;
  actions.reserve(2 * static_cast<std::size_t>(m));
  // Forward phase: the pipeline fills, stage s starts after s forward slots.
  for (int mb = 0; mb < m; ++mb) actions.push_back({ActionKind::kForward, mb, 0});
  // Backward phase, in micro-batch order: the last stage finishes F(m-1) and
  // starts B(0) at once; every earlier stage receives B(0)'s gradient first.
  for (int mb = 0; mb < m; ++mb) actions.push_back({ActionKind::kBackward, mb, 0});
  return actions;
}

}  // namespace paratrain::pipeline

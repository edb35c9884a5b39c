// Interleaved 1F1B (Narayanan et al., arXiv 2104.04473, section 2.2; Megatron-LM
// forward_backward_pipelining_with_interleaving): each stage holds v model
// chunks (stage r runs virtual stages r, r+p, r+2p, ...), so a pass is 1/v of
// a stage and the fill/drain bubble shrinks by v, at the price of v times as
// many activation sends. Requires m % p == 0 (validate_schedule).
#include "paratrain/pipeline/schedule.h"

#include <algorithm>

namespace paratrain::pipeline {

namespace {

// The k-th forward (or backward) of a stage, 0 <= k < m*v. Micro-batches go
// through the local chunks in groups of p: the first p forwards run chunk 0 on
// micro-batches 0..p-1, the next p run chunk 1 on the same micro-batches, ...,
// then the next group of p micro-batches starts again at chunk 0. Backwards
// walk the same order with the chunks reversed (the last model chunk's
// gradient exists first).
Action nth_pass(const ScheduleOptions& options, int k, ActionKind kind) {
  const int p = options.stages;
  const int v = options.virtual_stages;
  const int group = k / (p * v);
  const int in_group = k % (p * v);
  int chunk = in_group / p;
  if (kind == ActionKind::kBackward) chunk = v - 1 - chunk;
  return {kind, group * p + in_group % p, chunk};
}

}  // namespace

std::vector<Action> interleaved_1f1b_schedule(const ScheduleOptions& options, int stage) {
  validate_schedule(ScheduleKind::kInterleaved1F1B, options);
  validate_stage(options, stage);
  const int p = options.stages;
  const int v = options.virtual_stages;
  const int total = options.microbatches * v;  // passes of each direction on this stage
  std::vector<Action> actions;
  actions.reserve(2 * static_cast<std::size_t>(total));

  // Warm-up: the first backward on this stage (of its last local chunk) needs
  // micro-batch 0 to have gone through all p*v model chunks and back down to
  // this stage: (v - 1) * p forwards for the chunks before the last round,
  // plus 2 per later stage (its forward and its backward slot) as in Megatron.
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) actions.push_back(nth_pass(options, k, ActionKind::kForward));

  // Steady 1F1B: the next forward, then the oldest outstanding backward.
  const int steady = total - warmup;
  for (int i = 0; i < steady; ++i) {
    actions.push_back(nth_pass(options, warmup + i, ActionKind::kForward));
    actions.push_back(nth_pass(options, i, ActionKind::kBackward));
  }

  // Cool-down: the remaining backwards.
  for (int k = steady; k < total; ++k) actions.push_back(nth_pass(options, k, ActionKind::kBackward));
  return actions;
}

}  // namespace paratrain::pipeline

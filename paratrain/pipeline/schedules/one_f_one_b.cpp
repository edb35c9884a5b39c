// 1F1B, a.k.a. PipeDream-Flush (Narayanan et al., arXiv 2104.04473, section
// 2.2; Megatron-LM forward_backward_pipelining_without_interleaving): the same
// bubble as GPipe, but stage s holds at most p - s micro-batches of
// activations instead of m, because each backward frees one as soon as the
// pipeline is full.
#include "paratrain/pipeline/schedule.h"

#include <algorithm>

namespace paratrain::pipeline {

std::vector<Action> one_f_one_b_schedule(const ScheduleOptions& options, int stage) {
  validate_schedule(ScheduleKind::kOneFOneB, options);
  validate_stage(options, stage);
  const int p = options.stages;
  const int m = options.microbatches;
  std::vector<Action> actions;
  actions.reserve(2 * static_cast<std::size_t>(m));

  // Warm-up: forwards until this stage's first backward can arrive. The
  // gradient of micro-batch 0 comes back after it went through the p - s - 1
  // later stages, so stage s runs that many forwards ahead (all m if fewer).
  const int warmup = std::min(p - stage - 1, m);
  for (int mb = 0; mb < warmup; ++mb) actions.push_back({ActionKind::kForward, mb, 0});

  // Steady 1F1B: one forward (of the next micro-batch), then one backward (of
  // the oldest live micro-batch); the live count stays at warmup + 1.
  const int steady = m - warmup;
  for (int i = 0; i < steady; ++i) {
    actions.push_back({ActionKind::kForward, warmup + i, 0});
    actions.push_back({ActionKind::kBackward, i, 0});
  }

  // Cool-down: the backwards of the micro-batches still alive after the last forward.
  for (int mb = steady; mb < m; ++mb) actions.push_back({ActionKind::kBackward, mb, 0});
  return actions;
}

}  // namespace paratrain::pipeline

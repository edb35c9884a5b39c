// LossWindow: the training loss between two log lines. Each rank keeps the
// mean of the steps it took; at a log point the means of the ranks that
// train are averaged over the data-parallel group, and a non-finite result
// stops the run (the one divergence check of the loop). Not the logging
// (metrics_logger.h) nor the cadence of log points (the loop decides).
#pragma once

#include <chrono>
#include <cstdint>

namespace paratrain::comm {
class ProcessGroup;
}

namespace paratrain::train {

class LossWindow {
 public:
  // `computes`: this rank trains data (false on a parameter server, whose
  // zero loss must not count). `start_step`: optimizer steps already taken.
  LossWindow(bool computes, std::chrono::milliseconds timeout, int64_t start_step);

  // One optimizer step's mean loss on this rank (unscaled) over `examples`
  // examples: the mean over ranks weights each by its examples (unequal
  // data.batch_shares; equal weights otherwise).
  void add(double step_loss, double examples = 1.0);

  // Collective over `dp` (the group of now: an in-job recovery replaces
  // it): the mean over the training ranks of each one's mean since the last
  // reduce; starts a new window. Throws Error naming the steps when the mean
  // is not finite (the run diverged), and the collective's CommError when a
  // peer is lost.
  double reduce(comm::ProcessGroup& dp, int64_t step);

  // This rank's own mean since its last line, without a collective (a
  // parameter-server worker's line inside a window, where ranks do not
  // meet); starts a new line window but not a new reduce window.
  double take_own_line();

  // This rank's mean since the last reduce (a line after an in-job recovery
  // lost the collective).
  double own_mean() const;

  // Forgets the steps since the last reduce (an in-job recovery redoes or
  // undoes them); `step`: where training goes on from.
  void reset(int64_t step);

 private:
  bool computes_;
  std::chrono::milliseconds timeout_;
  int64_t reduced_at_;         // the step of the last reduce
  double sum_ = 0;             // since the last reduce: losses x examples
  double examples_ = 0;        // since the last reduce
  int64_t steps_ = 0;
  double line_sum_ = 0;        // since the last line (own or reduced)
  int64_t line_steps_ = 0;
};

}  // namespace paratrain::train

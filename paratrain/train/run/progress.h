// The progress bar (log.progress): one updating line per epoch on a
// terminal, with a bar, steps, samples/s, ETA and the last logged loss, like
// tqdm or Lightning's bar; the Trainer's periodic step log lines give way to
// it. Off the terminal (CI, files, pipes) the log lines stay as they are.
#pragma once

#include <chrono>
#include <string>

#include "paratrain/train/callbacks.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train {

// log.progress on this rank: "on", or "auto" on rank 0 when stderr is a
// terminal or `paratrain launch` says its own is (PARATRAIN_PROGRESS=1).
bool progress_bar_wanted(const LogConfig& log, int rank);

// "epoch 2/3 [#########-----------] 210/468 45% 1520 samples/s ETA 12s loss 0.4321"
// `width` is the bar's inner width; a NaN loss is left out.
std::string render_progress(const StepInfo& step, double loss, int width = 24);

class ProgressBar : public Callback {
 public:
  void on_train_batch_end(const StepInfo& step) override;
  void on_train_epoch_end(int64_t epoch) override;
  void on_fit_end(int64_t steps) override;

 private:
  using Clock = std::chrono::steady_clock;
  double loss_ = std::numeric_limits<double>::quiet_NaN();  // the last logged loss
  Clock::time_point drawn_{};
  bool shown_ = false;
};

}  // namespace paratrain::train

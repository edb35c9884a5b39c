// The progress bar's rendering and redraw policy (see progress.h).
#include "paratrain/train/run/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "paratrain/core/env.h"
#include "paratrain/core/logging.h"
#include "paratrain/train/run/metrics.h"

namespace paratrain::train {

bool progress_bar_wanted(const LogConfig& log, int rank) {
  if (rank != 0 || log.progress == "off") return false;
  if (log.progress == "on") return true;
  const auto launched = env::get("PARATRAIN_PROGRESS");
  return isatty(STDERR_FILENO) || (launched && *launched == "1");
}

std::string render_progress(const StepInfo& s, double loss, int width) {
  const double share = s.batches > 0 ? std::clamp(static_cast<double>(s.batch) / s.batches, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(std::lround(share * width));
  std::string line = fmt::format("epoch {}/{} [{}{}] {}/{} {:3.0f}% {:.0f} samples/s ETA {}", s.epoch + 1, s.epochs,
                                 std::string(filled, '#'), std::string(width - filled, '-'), s.batch, s.batches,
                                 100 * share, s.samples_per_s, format_duration(s.eta_s));
  if (!std::isnan(loss)) line += fmt::format(" loss {:.4f}", loss);
  return line;
}

void ProgressBar::on_train_batch_end(const StepInfo& step) {
  if (!std::isnan(step.loss)) loss_ = step.loss;
  // A terminal redraw costs a write per step; ten a second is smooth enough.
  const auto now = Clock::now();
  if (shown_ && now - drawn_ < std::chrono::milliseconds(100) && step.step < step.total_steps) return;
  drawn_ = now;
  shown_ = true;
  set_status_line(render_progress(step, loss_));
}

void ProgressBar::on_train_epoch_end(int64_t) {
  // The epoch's last state stays on screen, above the evaluation lines.
  if (shown_) finish_status_line();
  shown_ = false;
}

void ProgressBar::on_fit_end(int64_t) {
  if (shown_) finish_status_line();
  shown_ = false;
}

}  // namespace paratrain::train

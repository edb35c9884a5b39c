// The training loss between log lines (loss_window.h).
#include "paratrain/train/loop/loss_window.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"

namespace paratrain::train {

LossWindow::LossWindow(bool computes, std::chrono::milliseconds timeout, int64_t start_step)
    : computes_(computes), timeout_(timeout), reduced_at_(start_step) {}

void LossWindow::add(double step_loss, double examples) {
  sum_ += step_loss * examples;
  examples_ += examples;
  ++steps_;
  line_sum_ += step_loss;
  ++line_steps_;
}

double LossWindow::own_mean() const { return steps_ == 0 ? 0.0 : sum_ / examples_; }

double LossWindow::take_own_line() {
  const double mean = line_sum_ / static_cast<double>(std::max<int64_t>(line_steps_, 1));
  line_sum_ = 0;
  line_steps_ = 0;
  return mean;
}

double LossWindow::reduce(comm::ProcessGroup& dp, int64_t step) {
  // Averaged over the ranks that train, each weighted by its examples per
  // step (1 with equal shares): a parameter server adds 0 with weight 0.
  const double weight = !computes_ ? 0.0 : steps_ > 0 ? examples_ / static_cast<double>(steps_) : 1.0;
  auto mean = torch::tensor({computes_ ? own_mean() * weight : 0.0, computes_ ? weight : 0.0}, torch::kDouble);
  dp.all_reduce(mean, comm::ReduceOp::kSum)->wait(timeout_);
  const double loss = mean[0].item<double>() / mean[1].item<double>();
  const int64_t first = reduced_at_ + 1;
  reset(step);
  if (!std::isfinite(loss)) {
    throw Error(fmt::format(
        "rank {}: the training loss became {} by step {} (mean over steps {}..{}): training diverged. Lower "
        "optimizer.lr, set optimizer.clip_grad_norm, or resume from an earlier checkpoint; no checkpoint was "
        "written for this state",
        dp.rank(), loss, step, first, step));
  }
  return loss;
}

void LossWindow::reset(int64_t step) {
  reduced_at_ = step;
  sum_ = 0;
  examples_ = 0;
  steps_ = 0;
  line_sum_ = 0;
  line_steps_ = 0;
}

}  // namespace paratrain::train

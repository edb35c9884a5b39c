// PreemptionCheck: see preemption_check.h.
#include "paratrain/train/loop/preemption_check.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

PreemptionCheck::PreemptionCheck(Trainer::State& s) : s_(s) {
  const auto signals = preempt_signals_of(s.config);
  if (!signals.empty()) signals_.emplace(signals);
  if (s.config.train.preempt_signals == "auto" && s.is_main()) {
    if (signals.empty())
      spdlog::info("train.preempt_signals = \"auto\": off with {}; SIGTERM and SIGINT end the run at once",
                   preemption_unavailable(s.config));
    else
      spdlog::debug("train.preempt_signals = \"auto\": SIGTERM and SIGINT stop every rank at one step boundary "
                    "with a checkpoint (exit 75)");
  }
}

bool PreemptionCheck::agreed() {
  if (!signals_) return false;
  if (pending_) {
    pending_->wait(s_.timeout());
    pending_.reset();
    if (const int64_t agreed = flag_.item<int64_t>(); agreed > 0) {
      signal_ = static_cast<int>(agreed);
      return true;
    }
  }
  flag_ = at::tensor({static_cast<int64_t>(PreemptionSignals::received())}, at::kLong);
  pending_ = s_.world->all_reduce(flag_, comm::ReduceOp::kMax);
  return false;
}

void PreemptionCheck::drain() {
  if (!pending_) return;
  pending_->wait(s_.timeout());
  pending_.reset();
}

}  // namespace paratrain::train

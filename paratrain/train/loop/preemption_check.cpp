// PreemptionCheck: see preemption_check.h.
#include "paratrain/train/loop/preemption_check.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

PreemptionCheck::PreemptionCheck(Trainer::State& s) : s_(s) {
  const auto signals = preempt_signals_of(s.config);
  if (!signals.empty()) signals_.emplace(signals);
  if (s.config.train.preempt_signals == "auto" && s.is_main()) {
    if (signals.empty())
      spdlog::info("train.preempt_signals = \"auto\": off with {}; SIGTERM and SIGINT end the run at once",
                   preemption_auto_off(s.config));
    else
      spdlog::debug("train.preempt_signals = \"auto\": SIGTERM and SIGINT stop every rank at one step boundary "
                    "with a checkpoint (exit 75)");
  }
}

namespace {

// Note [The agreement is bookkeeping]
// The agreement rides along every step, started at one meeting and read at
// the next, so its record in the flight recorder would span a whole step
// and a profile would count that step as communication (a straggler's own
// sleep read as waiting for its peers). It goes to the backend's group
// under the recorder: timeouts still bound it, and the job's collectives
// keep the same sequence numbers on every rank for the hang doctor.
comm::ProcessGroup& agreement_group(comm::ProcessGroup& world) {
  if (auto* recorded = dynamic_cast<comm::RecordingGroup*>(&world)) return recorded->inner();
  return world;
}

}  // namespace

bool PreemptionCheck::agreed() {
  if (!signals_) return false;
  if (s_.world->size() == 1) {  // nobody to agree with
    signal_ = PreemptionSignals::received();
    return signal_ != 0;
  }
  if (pending_) {
    pending_->wait(s_.timeout());
    pending_.reset();
    if (const int64_t agreed = flag_.item<int64_t>(); agreed > 0) {
      signal_ = static_cast<int>(agreed);
      return true;
    }
  }
  flag_ = at::tensor({static_cast<int64_t>(PreemptionSignals::received())}, at::kLong);
  pending_ = agreement_group(*s_.world).all_reduce(flag_, comm::ReduceOp::kMax);
  return false;
}

void PreemptionCheck::drain() {
  if (!pending_) return;
  pending_->wait(s_.timeout());
  pending_.reset();
}

}  // namespace paratrain::train

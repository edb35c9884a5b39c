// Exit codes with a meaning across processes: what `paratrain train` returns
// and `paratrain launch` passes on, so a scheduler's script can tell them
// apart (docs/launchers.md).
#pragma once

namespace paratrain {

/// A rank stopped at a complete checkpoint because a preemption signal
/// (train.preempt_signals) reached the job: EX_TEMPFAIL, "try again later".
/// A requeued start with train.resume = "auto" continues from it.
inline constexpr int kPreemptedExitCode = 75;

}  // namespace paratrain

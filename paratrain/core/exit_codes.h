// Exit codes with a meaning across processes: what `paratrain train` returns
// and `paratrain launch` passes on, so a scheduler's script can tell them
// apart (docs/launchers.md).
#pragma once

namespace paratrain {

/// A rank stopped at a complete checkpoint because a preemption signal
/// (train.preempt_signals) reached the job: EX_TEMPFAIL, "try again later".
/// A requeued start with train.resume = "auto" continues from it.
inline constexpr int kPreemptedExitCode = 75;

/// A rank's collective failed because another rank or the link to it went
/// away (a CommError: a peer's process died, its heartbeats stopped, a
/// connection closed, a collective timed out): EX_UNAVAILABLE. Under `srun
/// -K` or any launcher that collects every rank's code, the rank that failed
/// first on its own keeps its own code (1, a signal); the ones that only
/// noticed it say 69.
inline constexpr int kPeerLostExitCode = 69;

}  // namespace paratrain

// Words for how workers ended: the message printed when a rank fails and the
// one-line summary printed when the launch ends. Pure functions of outcomes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "paratrain/launch/launcher.h"

namespace paratrain::launch {

// "rank 1 (pid 4242) exited with code 3" / "rank 0 (pid 4241) was killed by SIGKILL".
std::string describe(const WorkerOutcome& w);

// Compact rank list: {0, 1, 2, 5} -> "ranks 0-2, 5"; {3} -> "rank 3"; after
// eight groups "... and N more" (N ranks not shown).
std::string rank_list(const std::vector<int>& ranks);

// Which failed worker caused the launch to fail: returns its local rank, or
// -1 when every worker succeeded. Failures rank by how likely they are a
// cause rather than a consequence, then by ended_at, then by local rank:
//   0. stopped because its heartbeats stopped (WorkerOutcome::hang);
//   1. exited with a non-zero code on its own (before the launcher signalled it)
//      and its output does not say a peer went away;
//   2. killed by a signal the launcher did not send (a crash, the OOM killer);
//   3. exited non-zero after the launcher signalled it (a slow failure, or its
//      reaction to SIGTERM), output not about a peer;
//   4. exited non-zero saying a peer went away ("connection reset by peer");
//   5. killed by a signal after the launcher signalled it (our own teardown).
int pick_first_failure(const std::vector<WorkerOutcome>& workers);

// True when `output` (the end of a worker's output) says a peer went away.
bool mentions_lost_peer(std::string_view output);

// How a worker lost its peer, read from the end of its output: the words
// Gloo and paratrain's own errors use. `kind` is "heartbeat" (comm/peer_watch.h:
// a rank's beats stopped: stopped, frozen, or cut off by the network),
// "closed" (a connection closed or reset: the peer's processes died or its
// machine went away), "timeout" (a collective ran past world.timeout_s) or
// "unknown"; ranks/address/host are what the output named (peer_watch names
// the rank, host and address; Gloo names only the address, which the worker
// maps to ranks and host when its peer watch runs).
struct PeerLoss {
  std::string kind = "unknown";
  std::vector<int> ranks;
  std::string address;
  std::string host;
  std::string silent_for;  // "5.1" (seconds), heartbeat only
};
std::optional<PeerLoss> read_peer_loss(std::string_view output);

// The launcher's words for it, naming the node that holds the lost ranks
// (rank / nproc_per_node; its id from node_names when the rendezvous gave
// them), e.g. "node 1 (host vm, 10.77.0.2; rank 1) sent no heartbeat for
// 5.1 s: lost (stopped, frozen or cut off by the network), not a closed
// connection". Empty when the output names no peer loss.
std::string describe_peer_loss(std::string_view output, int nproc_per_node,
                               const std::vector<std::string>& node_names);

// Fills report.exit_code from the outcomes and returns the summary line. When
// no rank succeeded and every failure was tolerated (--keep-going), the launch
// failed all the same: first_failed is set to the likeliest cause and
// exit_code to its code (Note [Nobody succeeded] in report.cpp). E.g.
// "paratrain launch: FAILED with exit code 3: rank 1 (pid ..) exited with code 3
//  first; stopped by the launcher: rank 0 (pid ..) was killed by SIGTERM; succeeded: none"
std::string summarize(LaunchReport& report);

}  // namespace paratrain::launch

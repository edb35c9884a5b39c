// The ranks' own heartbeat watch: every rank beats to every peer over UDP
// from a thread of its own, and notices a peer whose beats stopped for longer
// than world.heartbeat_timeout_s. Then it aborts its process group, so the
// collective it is blocked in fails at once with a CommError naming the
// silent rank, its host, its pid and its last collective, instead of waiting
// for world.timeout_s. For jobs no launcher watches (hand-started, torchrun,
// mpirun, srun) and for the ranks of other nodes (a node's launcher sees only
// its own). Not here: the launcher's file heartbeats (launch/heartbeat_monitor.h),
// what the doctor makes of the dumps (comm/doctor/dump_reader.h).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

/// How a PeerWatch beats and judges.
struct PeerWatchOptions {
  /// Time between beats (world.heartbeat_s); shorter notices sooner, at one
  /// datagram per peer per beat.
  std::chrono::milliseconds interval{1000};
  /// A peer silent this long is taken for stopped (world.heartbeat_timeout_s).
  /// At least twice the interval, so one lost datagram is never a verdict.
  std::chrono::milliseconds timeout{15000};
  /// Where this rank receives its peers' beats: an address they can reach
  /// (comm::rank_address, the one Gloo binds). Port: any free one.
  std::string bind_address = "127.0.0.1";
  /// Abort the group when a peer goes silent (false: only log and dump; the
  /// negative control of the tests and a diagnosis-only mode).
  bool abort_group = true;
};

/// What this rank knows of a peer: exchanged once at construction.
struct PeerInfo {
  int rank = -1;
  long long pid = 0;
  std::string host;     ///< the peer's host name ($PARATRAIN_NODE_NAME when set)
  std::string address;  ///< where it receives beats
  int port = 0;
};

/// Runs from construction to destruction. Construction is collective over
/// `group` (an all_gather of every member's address, pid and host): every
/// member builds its PeerWatch at the same point of its program. `group`
/// must outlive the watch.
class PeerWatch {
 public:
  PeerWatch(ProcessGroup& group, PeerWatchOptions options);
  /// Tells every peer "exiting" (a clean shutdown is not a hang: they stop
  /// watching this rank), then stops the thread. Never blocks on a peer.
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  /// Beats sent so far (rounds: one beat goes to every peer).
  int64_t beats() const { return beats_.load(); }
  /// The message of the verdict once a peer was found silent; nullopt before.
  std::optional<std::string> verdict() const;
  /// The peers as exchanged at construction, indexed by rank (this rank's own entry included).
  const std::vector<PeerInfo>& peers() const { return peers_; }

  /// For an error that names peers only by address (Gloo: "Connection closed
  /// by peer [10.77.0.2]:PORT"): " ([10.77.0.2] is rank 1 on host H)" for each
  /// peer address in `message`, so the launcher can name the node
  /// (launch/report.h, describe_peer_loss). Empty when none appears.
  std::string name_peers_in(const std::string& message) const;

  /// Stops sending beats while the thread and the process go on: what a
  /// SIGSTOPped process looks like to its peers, for tests that run ranks
  /// as threads (a real SIGSTOP would stop every rank of the process).
  void stop_beating_for_test() { beating_.store(false); }

 private:
  void loop();
  void send_beats(const char* state);
  void receive();
  void judge(std::chrono::steady_clock::time_point now);

  ProcessGroup& group_;
  PeerWatchOptions options_;
  std::vector<PeerInfo> peers_;
  std::vector<std::pair<sockaddr_storage, socklen_t>> to_;  // peers_[r]'s address, resolved once
  std::string nonce_;  // rank 0's random job nonce: beats of another job are ignored
  int socket_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<int64_t> beats_{0};
  std::atomic<bool> beating_{true};
  // Per peer, touched by the thread only.
  struct Seen {
    std::chrono::steady_clock::time_point at;
    long long beat = 0;
    std::string last_op = "no beat received yet";
    bool exited = false;
  };
  std::vector<Seen> seen_;
  mutable std::mutex verdict_mu_;
  std::optional<std::string> verdict_;
  std::thread thread_;
};

}  // namespace paratrain::comm

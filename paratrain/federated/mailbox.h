// Messages between the federated server (rank 0) and the client hosts (the
// other ranks), over the comm layer's point-to-point send/recv instead of
// collectives, so that a client process that dies costs the round only its
// clients: the server notices the closed connection on that one peer and
// goes on with the others. Not the round protocol (round.h says which
// messages flow when) and not the comm layer.
//
// Note [Federated mailbox]
// - A message is a header (int64[5]: kind, round, client, dtype, numel) and,
//   when numel > 0, a payload tensor; each on its own tag, in order per peer
//   (Gloo matches sends and receives per peer and tag first-in first-out).
// - The server never blocks on one client: every client host has a sender
//   thread (the server's outbox to it) and a receiver thread (its inbox),
//   which hand the server's round loop Events through one queue. A peer
//   whose send or receive fails (Gloo: "connection closed by peer" once the
//   process died) becomes one `lost` Event and is never written to again.
// - Waits are long (kIdleWait): a dead process is detected by its closed
//   connection, not by a timeout; a live but slow one is the round
//   deadline's business (federated.round_timeout_s), which only stops the
//   server waiting for it, and its late messages are dropped by round number.
// - A Gloo receive must not be given up on while it is posted (the buffer
//   would be freed under the transport), so receives are never timed out on
//   purpose: shutdown() waits for each host's goodbye and aborts the group
//   only for hosts that never send it.
// - Clients call send_message/receive_message directly: they talk only to
//   the server, and a server that died fails them at once (CommError).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::federated {

enum class MessageKind : int64_t {
  kRound = 1,   // server -> host: round r starts; payload int64 = this host's participating clients
  kModel,       // server -> host: the global model x_t (float32)
  kKeyList,     // server -> host (secure): int64 [n, 33] = participant id + its public key bytes
  kClose,       // server -> host (secure): the round closed; payload int64 = dropped participants
  kStop,        // server -> host: the run is over
  kKeys,        // host -> server (secure): int64 [k, 33] = hosted participant id + public key bytes
  kUpdate,      // host -> server: one client's [n delta, n, 1, n loss] (float32, or masked int64)
  kRoundDone,   // host -> server: every client of the round was tried; payload int64 = those that failed
  kSeeds,       // host -> server (secure): int64 [k, 1 + 32 d] = survivor id + its seeds with each dropped
  kBye,         // host -> server: answer to kStop, the host leaves
};
const char* to_string(MessageKind kind);

struct Message {
  MessageKind kind = MessageKind::kStop;
  int64_t round = 0;
  int64_t client = -1;  // the client it is about, -1 for the whole host
  at::Tensor payload;   // contiguous CPU; undefined = none
  int from = -1;        // filled on receipt: the sender's rank
};

// How long one send or receive may wait: effectively unbounded (see the
// Note); 7 days keeps deadline arithmetic far from overflow.
inline constexpr std::chrono::milliseconds kIdleWait = std::chrono::hours(24 * 7);

// Blocking: header, then payload. Throws CommError (TimeoutError) naming the
// peer, e.g. when it died.
void send_message(comm::ProcessGroup& group, int dst, const Message& message,
                  std::chrono::milliseconds timeout = kIdleWait);
Message receive_message(comm::ProcessGroup& group, int src, std::chrono::milliseconds timeout = kIdleWait);

// Client id lists as payloads (int64 [n]; n = 0 is no payload), and back;
// ids_of throws CommError on a payload that is not int64.
at::Tensor ids_tensor(const std::vector<int64_t>& ids);
std::vector<int64_t> ids_of(const at::Tensor& payload);

// What the server's round loop waits for: a message, or a peer lost.
struct Event {
  int peer = -1;
  std::optional<Message> message;  // empty: the peer is lost (see `why`)
  std::string why;
};

// The server's side: a sender and a receiver thread per client host.
class ServerLinks {
 public:
  using Clock = std::chrono::steady_clock;
  ServerLinks(comm::ProcessGroup& group, const std::vector<int>& peers);
  ~ServerLinks();  // shutdown() if it was not called; never throws
  ServerLinks(const ServerLinks&) = delete;
  ServerLinks& operator=(const ServerLinks&) = delete;

  // Queues `message` for `peer`; dropped when the peer is lost.
  void post(int peer, Message message);
  // The next event, or nullopt once `deadline` passed with none.
  std::optional<Event> next(Clock::time_point deadline);
  bool alive(int peer) const;
  // Why `peer` was lost ("" while it is alive).
  std::string why(int peer) const;
  std::vector<int> live_peers() const;
  // Sends kStop to every live host and waits up to `grace` for their kBye
  // (events that arrive meanwhile are dropped); hosts that did not answer
  // are cut off by aborting the group. Then joins every thread.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Peer {
    int rank = -1;
    std::deque<Message> outbox;  // guarded by mu_
    bool lost = false;           // guarded by mu_
    std::string why;             // guarded by mu_: what failed when it was lost
    bool said_bye = false;       // guarded by mu_
    std::thread sender, receiver;
  };
  void send_loop(Peer& peer);
  void receive_loop(Peer& peer);
  void lose(Peer& peer, const std::string& why);  // mu_ held
  Peer* find(int rank) const;

  comm::ProcessGroup& group_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // outboxes, events and shutdown
  std::deque<Event> events_;    // guarded by mu_
  bool stopping_ = false;       // guarded by mu_: senders finish their queue, then exit
  bool shut_down_ = false;
  std::vector<std::unique_ptr<Peer>> peers_;
};

}  // namespace paratrain::federated

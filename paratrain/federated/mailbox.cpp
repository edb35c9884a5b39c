// The federated mailbox: see Note [Federated mailbox] in mailbox.h.
#include "paratrain/federated/mailbox.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::federated {
namespace {

// Tags of their own, so a federated run's messages can never match another
// user of the same group's point-to-point operations.
constexpr int kHeaderTag = 0x4645;   // "FE"
constexpr int kPayloadTag = 0x4646;
constexpr int64_t kHeaderLength = 5;

// A receive that timed out is still posted inside Gloo: its buffer must
// outlive it, so the handle and tensor are parked here for the process's
// life rather than freed under the transport. It happens only when a peer
// is silent for kIdleWait or a caller passed a short timeout.
void park(comm::WorkHandle work, at::Tensor tensor) {
  static std::mutex mu;
  static std::vector<std::pair<comm::WorkHandle, at::Tensor>> parked;
  std::lock_guard<std::mutex> lock(mu);
  parked.emplace_back(std::move(work), std::move(tensor));
}

void receive_into(comm::ProcessGroup& group, at::Tensor& tensor, int src, int tag,
                  std::chrono::milliseconds timeout) {
  auto work = group.recv(tensor, src, tag);
  try {
    work->wait(timeout);
  } catch (const TimeoutError&) {
    park(work, tensor);
    throw;
  }
}

bool valid_kind(int64_t k) {
  return k >= static_cast<int64_t>(MessageKind::kRound) && k <= static_cast<int64_t>(MessageKind::kBye);
}

}  // namespace

const char* to_string(MessageKind kind) {
  switch (kind) {
    case MessageKind::kRound: return "round";
    case MessageKind::kModel: return "model";
    case MessageKind::kKeyList: return "key list";
    case MessageKind::kClose: return "close";
    case MessageKind::kStop: return "stop";
    case MessageKind::kKeys: return "keys";
    case MessageKind::kUpdate: return "update";
    case MessageKind::kRoundDone: return "round done";
    case MessageKind::kSeeds: return "seeds";
    case MessageKind::kBye: return "bye";
  }
  return "?";
}

at::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  auto t = at::empty({static_cast<int64_t>(ids.size())}, at::kLong);
  std::copy(ids.begin(), ids.end(), t.data_ptr<int64_t>());
  return t;
}

std::vector<int64_t> ids_of(const at::Tensor& payload) {
  if (!payload.defined() || payload.numel() == 0) return {};
  if (payload.scalar_type() != at::kLong)
    throw CommError(fmt::format("a federated message carries {} where client ids (int64) belong",
                                c10::toString(payload.scalar_type())));
  const at::Tensor t = payload.contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

void send_message(comm::ProcessGroup& group, int dst, const Message& message, std::chrono::milliseconds timeout) {
  at::Tensor payload = message.payload.defined() ? message.payload.contiguous() : at::Tensor();
  const int64_t numel = payload.defined() ? payload.numel() : 0;
  auto header = at::tensor({static_cast<int64_t>(message.kind), message.round, message.client,
                            payload.defined() ? static_cast<int64_t>(payload.scalar_type()) : int64_t{-1}, numel},
                           at::kLong);
  group.send(header, dst, kHeaderTag)->wait(timeout);
  if (numel > 0) group.send(payload, dst, kPayloadTag)->wait(timeout);
}

Message receive_message(comm::ProcessGroup& group, int src, std::chrono::milliseconds timeout) {
  auto header = at::zeros({kHeaderLength}, at::kLong);
  receive_into(group, header, src, kHeaderTag, timeout);
  const int64_t* h = header.data_ptr<int64_t>();
  if (!valid_kind(h[0]) || h[4] < 0 || (h[4] > 0 && (h[3] < 0 || h[3] >= static_cast<int64_t>(at::ScalarType::NumOptions))))
    throw CommError(fmt::format("rank {}: a malformed federated message from rank {} (kind {}, {} elements); "
                                "are both ends the same paratrain version?",
                                group.rank(), src, h[0], h[4]));
  Message m;
  m.kind = static_cast<MessageKind>(h[0]);
  m.round = h[1];
  m.client = h[2];
  m.from = src;
  if (h[4] > 0) {
    m.payload = at::empty({h[4]}, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[3])));
    receive_into(group, m.payload, src, kPayloadTag, timeout);
  }
  return m;
}

ServerLinks::ServerLinks(comm::ProcessGroup& group, const std::vector<int>& peers) : group_(group) {
  for (int rank : peers) {
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->rank = rank;
  }
  // Threads start once every Peer exists: they only touch their own.
  for (auto& p : peers_) {
    Peer& peer = *p;
    peer.sender = std::thread([this, &peer] { send_loop(peer); });
    peer.receiver = std::thread([this, &peer] { receive_loop(peer); });
  }
}

ServerLinks::~ServerLinks() {
  try {
    shutdown(std::chrono::seconds(30));
  } catch (...) {
    // A destructor must not throw; shutdown already cut every peer off.
  }
}

ServerLinks::Peer* ServerLinks::find(int rank) const {
  for (const auto& p : peers_) {
    if (p->rank == rank) return p.get();
  }
  return nullptr;
}

void ServerLinks::post(int peer, Message message) {
  Peer* p = find(peer);
  TORCH_CHECK(p, "ServerLinks::post: rank ", peer, " is not a client host");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (p->lost || stopping_) return;
    p->outbox.push_back(std::move(message));
  }
  cv_.notify_all();
}

std::optional<Event> ServerLinks::next(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return !events_.empty(); })) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool ServerLinks::alive(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Peer* p = find(peer);
  return p && !p->lost;
}

std::string ServerLinks::why(int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Peer* p = find(peer);
  return p ? p->why : std::string();
}

std::vector<int> ServerLinks::live_peers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& p : peers_) {
    if (!p->lost) out.push_back(p->rank);
  }
  return out;
}

void ServerLinks::lose(Peer& peer, const std::string& why) {
  if (peer.lost) return;
  peer.lost = true;
  peer.why = why;
  peer.outbox.clear();
  events_.push_back(Event{peer.rank, std::nullopt, why});
}

void ServerLinks::send_loop(Peer& peer) {
  for (;;) {
    Message m;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return peer.lost || !peer.outbox.empty() || stopping_; });
      if (peer.lost || peer.outbox.empty()) return;  // lost, or stopping with nothing left to send
      m = std::move(peer.outbox.front());
      peer.outbox.pop_front();
    }
    try {
      send_message(group_, peer.rank, m);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        lose(peer, fmt::format("sending it the {} message of round {} failed: {}", to_string(m.kind), m.round,
                               e.what()));
      }
      cv_.notify_all();
      return;
    }
  }
}

void ServerLinks::receive_loop(Peer& peer) {
  for (;;) {
    Message m;
    try {
      m = receive_message(group_, peer.rank);
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!peer.said_bye) lose(peer, e.what());
        peer.said_bye = true;  // nothing more will come from it
      }
      cv_.notify_all();
      return;
    }
    const bool bye = m.kind == MessageKind::kBye;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bye) peer.said_bye = true;
      if (!shut_down_) events_.push_back(Event{peer.rank, std::move(m), ""});
    }
    cv_.notify_all();
    if (bye) return;
  }
}

void ServerLinks::shutdown(std::chrono::milliseconds grace) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& p : peers_) {
      if (!p->lost) p->outbox.push_back(Message{MessageKind::kStop, 0, -1, at::Tensor()});
    }
    stopping_ = true;
    cv_.notify_all();
    // said_bye is also set when a receiver ends on an error: every receiver
    // is then done or about to be.
    const bool all_gone = cv_.wait_for(lock, grace, [&] {
      return std::all_of(peers_.begin(), peers_.end(), [](const auto& p) { return p->said_bye; });
    });
    if (!all_gone) {
      lock.unlock();
      // A host that neither answered nor died keeps a receive (or a send)
      // of ours blocked: aborting the group fails them, so the threads end.
      group_.abort();
    }
  }
  for (auto& p : peers_) {
    if (p->sender.joinable()) p->sender.join();
    if (p->receiver.joinable()) p->receiver.join();
  }
}

}  // namespace paratrain::federated

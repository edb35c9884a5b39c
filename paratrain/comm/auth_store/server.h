// The authenticated store's server: a thread of rank 0 that serves keys only
// to processes that prove they know the job's token (handshake.h). One
// poll() loop, many clients; a refused or misbehaving connection is logged
// with its peer address and closed, and never blocks the others.
// Not here: the client (store.h) or which address to bind (rendezvous.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace paratrain::comm::auth {

struct StoreServerOptions {
  // Where to listen. Loopback keeps a single-node job off the network; a
  // multi-node job needs an address the other nodes reach ("0.0.0.0" for all).
  std::string bind_address = "127.0.0.1";
  // 0 picks a free port (tests); port() says which.
  int port = 0;
  // The job's secret and id: a client must MAC the server's challenge and its
  // job id with the token, and claim the same job id. Never logged.
  std::string token;
  std::string job_id = "none";
  // A connection that has not completed the handshake by then is closed.
  // Shorter frees the slots of silent peers sooner; too short refuses
  // legitimate clients on a heavily loaded machine.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(30);
  // At most this many connections may be in their handshake at once; one
  // more drops the oldest of them (logged; see Note [Pending handshakes] in
  // server.cpp). A legitimate client finishes its handshake in one round
  // trip, so only a flood of clients that never finish reaches the cap.
  std::size_t max_pending_handshakes = 256;
  // Called (on the server thread) for every refused or dropped connection,
  // with the peer address and the reason, after it is logged. Tests use it.
  std::function<void(const std::string& peer, const std::string& reason)> on_refused;
};

class StoreServer {
 public:
  // Binds and listens, then serves on its own thread until destroyed.
  // Throws CommError naming the address when it cannot bind (port in use).
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // "ADDRESS:PORT" it listens on, for messages.
  std::string where() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paratrain::comm::auth

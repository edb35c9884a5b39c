// The job's store, served by the launcher (the agent) instead of rank 0, as
// torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE): it lives for the whole
// launch, across generations, so no worker's death (rank 0's included) takes
// it down, and the agents' own rendezvous (agent_rendezvous.h) meets in it.
// Not the workers' side of it: comm/rendezvous.cpp connects them as clients.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace paratrain::launch {

// Which protocol an agent store speaks; the workers learn it from
// PARATRAIN_AGENT_STORE (comm/rendezvous.cpp).
enum class AgentStoreKind {
  // comm/auth_store: only processes that know the job token are served.
  // Chosen when the launch has a token and paratrain was built with libsodium.
  kAuthenticated,
  // c10d's TCPStore: anyone who reaches the port is served.
  kTcp,
};

// kAuthenticated when `token` is non-empty and the authenticated store is
// built in, else kTcp. Every agent of a job computes the same answer (same
// token, same build), so the non-serving ones need not ask the host.
AgentStoreKind agent_store_kind(const std::string& token);
// "auth" or "tcp": the value of PARATRAIN_AGENT_STORE.
const char* agent_store_name(AgentStoreKind kind);

struct AgentStoreOptions {
  // Where to listen: loopback for a single-node job, the rendezvous host's
  // address (or $PARATRAIN_STORE_BIND) when other nodes must reach it.
  std::string bind_address = "127.0.0.1";
  int port = 0;
  std::string token;           // empty: kTcp
  std::string job_id = "none"; // TORCHELASTIC_RUN_ID: the auth handshake checks it
};

// Serves the store until destroyed. Throws CommError naming the address when
// it cannot listen (the port is taken: another job, or another agent of this
// job on the same host already serves it).
class AgentStore {
 public:
  explicit AgentStore(const AgentStoreOptions& options);
  ~AgentStore();
  AgentStore(const AgentStore&) = delete;
  AgentStore& operator=(const AgentStore&) = delete;

  AgentStoreKind kind() const { return kind_; }
  // "ADDRESS:PORT", for messages.
  const std::string& where() const { return where_; }

 private:
  struct Impl;
  AgentStoreKind kind_;
  std::string where_;
  std::unique_ptr<Impl> impl_;
};

struct AgentStoreClientOptions {
  std::string host;
  int port = 0;
  std::string token;
  std::string job_id = "none";
  AgentStoreKind kind = AgentStoreKind::kTcp;
  // How long to keep trying to connect, and the default for get()/wait().
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

// A client of an agent store (the agents' own rendezvous connects with it,
// the host agent to itself too). Throws CommError/TimeoutError naming the
// address when it cannot connect or is refused.
c10::intrusive_ptr<c10d::Store> connect_agent_store(const AgentStoreClientOptions& options);

}  // namespace paratrain::launch

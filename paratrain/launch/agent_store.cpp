// The agent store (agent_store.h): comm/auth_store's server with the job
// token, else c10d's TCPStore, held by the launcher for the whole launch.
#include "paratrain/launch/agent_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/comm/auth_store/server.h"
#include "paratrain/comm/auth_store/store.h"
#include "paratrain/core/error.h"

namespace paratrain::launch {

AgentStoreKind agent_store_kind(const std::string& token) {
  return !token.empty() && comm::auth::available() ? AgentStoreKind::kAuthenticated : AgentStoreKind::kTcp;
}

const char* agent_store_name(AgentStoreKind kind) {
  return kind == AgentStoreKind::kAuthenticated ? "auth" : "tcp";
}

struct AgentStore::Impl {
  std::unique_ptr<comm::auth::StoreServer> auth;
  c10::intrusive_ptr<c10d::TCPStore> tcp;
};

AgentStore::AgentStore(const AgentStoreOptions& options)
    : kind_(agent_store_kind(options.token)), impl_(std::make_unique<Impl>()) {
  if (kind_ == AgentStoreKind::kAuthenticated) {
    comm::auth::StoreServerOptions so;
    so.bind_address = options.bind_address;
    so.port = options.port;
    so.token = options.token;
    so.job_id = options.job_id;
    impl_->auth = std::make_unique<comm::auth::StoreServer>(std::move(so));  // CommError naming the address
    where_ = impl_->auth->where();
    return;
  }
  // c10d's TCPStore server listens on every interface whatever host it is
  // given (the host only names where its own client connects): one reason
  // the authenticated store exists (Note [Authenticated rendezvous]).
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(options.port);
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(30);
  try {
    impl_->tcp = c10::make_intrusive<c10d::TCPStore>(options.bind_address, so);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw CommError(fmt::format("paratrain launch: could not serve the job's store (TCPStore) on port {}: {}. Is "
                                "the port already in use? Pick another --master-port/--rdzv-endpoint port",
                                options.port, msg));
  }
  where_ = fmt::format("*:{}", options.port);
}

AgentStore::~AgentStore() = default;

c10::intrusive_ptr<c10d::Store> connect_agent_store(const AgentStoreClientOptions& options) {
  if (options.kind == AgentStoreKind::kAuthenticated) {
    comm::auth::AuthStoreOptions co;
    co.host = options.host;
    co.port = options.port;
    co.token = options.token;
    co.job_id = options.job_id;
    co.timeout = options.timeout;
    return c10::make_intrusive<comm::auth::AuthStore>(std::move(co));
  }
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(options.port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = options.timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(options.host, so);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw TimeoutError(fmt::format("paratrain launch: could not reach the rendezvous store at {}:{} within {} s: {}",
                                   options.host, options.port,
                                   std::chrono::duration<double>(options.timeout).count(), msg));
  }
}

}  // namespace paratrain::launch

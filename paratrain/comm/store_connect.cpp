// Connecting to the rendezvous store: see store_connect.h.
#include "paratrain/comm/store_connect.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/comm/auth_store/server.h"
#include "paratrain/comm/auth_store/store.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {

bool is_local_address(const std::string& addr) {
  if (addr == "127.0.0.1" || addr == "localhost" || addr == "::1") return true;
  char host[256] = {0};
  return gethostname(host, sizeof host - 1) == 0 && addr == host;
}

namespace {

// Note [Authenticated rendezvous]
// c10d's TCPStore admits anyone who reaches its port, listens on every
// interface, and has no notion of a job: another user's process could join a
// job as a rank, and a second job on the same port attached to the first.
// With PARATRAIN_JOB_TOKEN set (`paratrain launch` sets a fresh one per job)
// rank 0 serves comm/auth_store instead: a client is admitted only after
// proving with an HMAC over a fresh challenge that it knows the token and
// names the same job id (TORCHELASTIC_RUN_ID), and the server proves the
// same back. It listens on loopback when the whole job runs on this machine,
// else on MASTER_ADDR's address, or where PARATRAIN_STORE_BIND says.
// Under `paratrain launch` the launcher (the agent) serves that store for the
// whole launch (launch/agent_store.h) and sets TORCHELASTIC_USE_AGENT_STORE=True
// with PARATRAIN_AGENT_STORE=auth: then every rank, rank 0 included, is an
// AuthStore client, and a worker's death never takes the store down.
// Without a token (hand-started or torchrun jobs), under torchrun's agent
// store (a TCPStore: no PARATRAIN_AGENT_STORE), or without libsodium, the
// TCPStore path below stays as it was. docs/launchers.md says what the
// token does not protect (Gloo's own connections).

// PARATRAIN_JOB_TOKEN, when set. An empty token would be a secret everyone
// knows: refused rather than silently unauthenticated.
std::optional<std::string> job_token() {
  const char* token = std::getenv("PARATRAIN_JOB_TOKEN");  // env::get would read "" as unset
  if (token == nullptr) return std::nullopt;
  if (*token == '\0') {
    throw ConfigError("environment variable PARATRAIN_JOB_TOKEN is set but empty; unset it (no authentication) or "
                      "set the job's secret on every rank (paratrain launch generates one when it is unset)");
  }
  return std::string(token);
}

struct StoreEndpoint {
  std::string bind;     // where rank 0 listens
  std::string connect;  // where every rank (rank 0 too) connects
};

StoreEndpoint store_endpoint(const WorldInfo& world) {
  const bool one_host = world.local_world_size == world.world_size && is_local_address(world.master_addr);
  if (auto chosen = env::get("PARATRAIN_STORE_BIND")) {
    const bool wildcard = *chosen == "0.0.0.0" || *chosen == "::";
    return {*chosen, one_host && !wildcard ? *chosen : world.master_addr};
  }
  // A one-host job never needs the network, whatever MASTER_ADDR names (this
  // host's name may resolve to 127.0.1.1 or to a public address).
  if (one_host) return {"127.0.0.1", "127.0.0.1"};
  return {world.master_addr, world.master_addr};
}

c10::intrusive_ptr<c10d::Store> connect_auth_store(const WorldInfo& world, const InitOptions& options,
                                                   const std::string& token, std::string& where) {
  const StoreEndpoint ep = store_endpoint(world);
  where = fmt::format("authenticated store at {}:{}", ep.connect, world.master_port);
  auto with_rank = [&](const std::exception& e) { return fmt::format("rank {}: {}", world.rank, e.what()); };
  try {
    std::shared_ptr<auth::StoreServer> server;
    // Under an agent store the launcher serves it (launch/agent_store.h), for
    // every generation: rank 0 is a client like the others.
    if (world.rank == 0 && !world.use_agent_store) {
      auth::StoreServerOptions so;
      so.bind_address = ep.bind;
      so.port = world.master_port;
      so.token = token;
      so.job_id = world.run_id;
      server = std::make_shared<auth::StoreServer>(std::move(so));
      spdlog::info("rendezvous: store on {} admits only processes that know this job's token "
                   "(PARATRAIN_JOB_TOKEN, job id '{}')",
                   server->where(), world.run_id);
    }
    auth::AuthStoreOptions co;
    co.host = ep.connect;
    co.port = world.master_port;
    co.token = token;
    co.job_id = world.run_id;
    co.timeout = options.timeout;
    auto store = c10::make_intrusive<auth::AuthStore>(std::move(co));
    store->hold(server);
    return store;
  } catch (const TimeoutError& e) {
    throw TimeoutError(with_rank(e));
  } catch (const ConfigError& e) {
    throw ConfigError(with_rank(e));
  } catch (const CommError& e) {
    throw CommError(with_rank(e));
  }
}

// Note [Whose store is this]
// Two jobs that happen to share MASTER_PORT on one host (hand-started, or
// Slurm jobs given the same port) meet in one plain TCPStore: the second
// job's rank 0 cannot serve it, and its other ranks would check in with the
// first job's ranks and fail far from the cause. Rank 0 writes its job's id
// (TORCHELASTIC_RUN_ID, or "slurm-<SLURM_JOB_ID>") into the store; every
// other rank reads it before writing anything and refuses a store of
// another job by name. Jobs without any id ("none") cannot be told apart.
void check_store_owner(c10d::Store& store, const WorldInfo& world, bool serving, const std::string& where) {
  static const std::string kOwner = "paratrain/store_owner";
  if (serving) {
    const std::string id = world.run_id;
    store.set(kOwner, std::vector<uint8_t>(id.begin(), id.end()));
    return;
  }
  const auto got = store.get(kOwner);
  const std::string owner(got.begin(), got.end());
  if (owner != world.run_id)
    throw ConfigError(fmt::format("rank {} of job '{}' reached the {}, which is job '{}''s: two jobs share "
                                  "MASTER_PORT {} on this host. Give each job its own MASTER_PORT (under Slurm, "
                                  "leave it unset: each job then takes 15000 + its id's last four digits)",
                                  world.rank, world.run_id, where, owner, world.master_port));
}

// Note [A greeting that came late]
// The probe (Note [Probing for the greeting] in auth_store/store.cpp) waits
// a second for the authenticated store's greeting. A server thread starved
// for longer makes the store read as c10d's TCPStore, and c10d's client
// then takes the late greeting for a reply: a length of ~5.7e18,
// std::bad_alloc or std::length_error, or a reply of the wrong kind ("...
// response is expected", when the greeting answers a wait), either in this
// thread (caught below) or in the client's callback thread, where it ends
// in std::terminate with no word of why. While the client connects, a terminate handler says why
// first; its text is fixed before any thread can need it.
std::mutex g_late_mutex;
int g_late_users = 0;
std::terminate_handler g_late_previous = nullptr;
std::string g_late_text;

[[noreturn]] void explain_late_greeting() {
  [[maybe_unused]] const ssize_t n = ::write(2, g_late_text.data(), g_late_text.size());
  if (g_late_previous != nullptr) g_late_previous();
  std::abort();
}

std::string late_greeting_text(const WorldInfo& world) {
  return fmt::format("rank {}: c10d's TCPStore client failed while connecting to {}:{}: that port is most likely "
                     "served by a paratrain job's authenticated store whose greeting came after the probe's 1 s "
                     "(a loaded machine). Start the ranks with `paratrain launch`, export that job's "
                     "PARATRAIN_JOB_TOKEN, or check MASTER_PORT",
                     world.rank, world.master_addr, world.master_port);
}

class LateGreetingExplainer {
 public:
  explicit LateGreetingExplainer(const WorldInfo& world) {
    std::lock_guard<std::mutex> lock(g_late_mutex);
    if (g_late_users++ > 0) return;
    g_late_text = "paratrain: error: " + late_greeting_text(world) + "\n";
    g_late_previous = std::set_terminate(explain_late_greeting);
  }
  ~LateGreetingExplainer() {
    std::lock_guard<std::mutex> lock(g_late_mutex);
    if (--g_late_users > 0) return;
    std::set_terminate(g_late_previous);
  }
  LateGreetingExplainer(const LateGreetingExplainer&) = delete;
  LateGreetingExplainer& operator=(const LateGreetingExplainer&) = delete;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world, const InitOptions& options,
                                              std::string& where) {
  if (auto token = job_token()) {
    const bool ours = !world.use_agent_store || world.agent_store_authenticated;
    if (ours && auth::available()) return connect_auth_store(world, options, *token, where);
    if (world.rank == 0) {
      spdlog::warn("rendezvous: PARATRAIN_JOB_TOKEN is set but {}: using c10d's unauthenticated TCPStore",
                   world.use_agent_store ? "the agent serves a TCPStore (TORCHELASTIC_USE_AGENT_STORE)"
                                         : "this paratrain was built without libsodium (install libsodium-dev "
                                           "and rebuild for the authenticated store)");
    }
  } else if (world.rank == 0 && !world.use_agent_store) {
    spdlog::info("rendezvous: no PARATRAIN_JOB_TOKEN: c10d's TCPStore on *:{} admits any process that reaches "
                 "the port (paratrain launch sets a token; see docs/launchers.md)",
                 world.master_port);
  }
  c10d::TCPStoreOptions store_opts;
  store_opts.port = static_cast<std::uint16_t>(world.master_port);
  store_opts.isServer = world.rank == 0 && !world.use_agent_store;
  store_opts.numWorkers = world.world_size;
  // We check arrival ourselves (check_in) so the error can name the missing
  // ranks; the store's own wait would only say "timed out".
  store_opts.waitWorkers = false;
  store_opts.timeout = options.timeout;
  // A hand-started rank without the token may be meeting a job's
  // authenticated store: ask before c10d's client reads its greeting (Note
  // [Probing for the greeting] in auth_store/store.cpp). Agent stores are
  // known: ours says PARATRAIN_AGENT_STORE, torchrun's is a TCPStore.
  if (!store_opts.isServer && !world.use_agent_store) {
    constexpr auto kGreetWithin = std::chrono::seconds(1);
    std::string why;
    const auto greeting = auth::probe_greeting(world.master_addr, world.master_port, options.timeout,
                                               std::min<std::chrono::milliseconds>(options.timeout, kGreetWithin), why);
    if (greeting == auth::Greeting::authenticated) {
      throw CommError(fmt::format(
          "rank {}: the store at {}:{} refused this process: it is a paratrain job's authenticated store, which "
          "admits only processes that know the job's token, and PARATRAIN_JOB_TOKEN is not set here. Start the "
          "ranks with `paratrain launch` (it hands them the token), export that job's PARATRAIN_JOB_TOKEN, or "
          "launch the job with --plain-store to admit processes without a token",
          world.rank, world.master_addr, world.master_port));
    }
    if (greeting == auth::Greeting::unreachable) {
      throw TimeoutError(fmt::format("rank {}: could not reach the {} within {} s: {}. Rank 0 (which serves the "
                                     "store) never arrived or the address is wrong",
                                     world.rank, where, std::chrono::duration<double>(options.timeout).count(),
                                     why));
    }
  }
  std::optional<LateGreetingExplainer> explain;
  if (!store_opts.isServer && !world.use_agent_store) explain.emplace(world);
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, store_opts);
    if (!world.use_agent_store) check_store_owner(*store, world, store_opts.isServer, where);
    return store;
  } catch (const ConfigError&) {
    throw;
  } catch (const std::bad_alloc&) {
    if (!explain) throw;
    throw CommError(late_greeting_text(world));
  } catch (const std::length_error&) {
    if (!explain) throw;
    throw CommError(late_greeting_text(world));
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    // A reply of the wrong kind: the greeting read as one (the Note above).
    if (explain && msg.find("response is expected") != std::string::npos)
      throw CommError(fmt::format("{} (c10d: {})", late_greeting_text(world), msg));
    if (world.use_agent_store) {
      throw TimeoutError(fmt::format("rank {}: could not reach torchrun's agent store ({}; "
                                     "TORCHELASTIC_USE_AGENT_STORE is set) within {} s: {}. Is this process "
                                     "running under torchrun, with its MASTER_ADDR/MASTER_PORT?",
                                     world.rank, where, std::chrono::duration<double>(options.timeout).count(),
                                     msg));
    }
    if (world.rank == 0) {
      throw CommError(fmt::format("rank 0: could not serve the {}: {}. Is the port already in use? "
                                  "Pick another MASTER_PORT", where, msg));
    }
    throw TimeoutError(fmt::format("rank {}: could not reach the {} within {} s: {}. Rank 0 (which "
                                   "serves the store) never arrived or the address is wrong",
                                   world.rank, where,
                                   std::chrono::duration<double>(options.timeout).count(), msg));
  }
}

}  // namespace paratrain::comm

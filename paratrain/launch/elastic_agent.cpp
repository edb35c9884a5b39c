// The multi-agent launch loop (elastic_agent.h). The protocol between agents
// is agent_rendezvous.cpp's; starting and stopping workers is the
// Supervisor's; this file only sequences them and keeps the restart count.
#include "paratrain/launch/elastic_agent.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/core/error.h"
#include "paratrain/launch/agent_rendezvous.h"
#include "paratrain/launch/agent_store.h"
#include "paratrain/launch/line_prefixer.h"
#include "paratrain/launch/report.h"
#include "paratrain/launch/spawn.h"
#include "paratrain/launch/supervisor.h"

namespace paratrain::launch {
namespace {

// How long the serving agent, its own workers done, waits for the other
// members to say done before it takes the store away from them.
constexpr auto kDoneWait = std::chrono::seconds(60);

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

std::string default_node_id() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return fmt::format("{}-{}", host, static_cast<long long>(getpid()));
}

}  // namespace

bool is_this_host(const std::string& host) {
  if (is_loopback(host)) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool mine = false;
  // Binding port 0 succeeds exactly for addresses of this machine's interfaces.
  for (addrinfo* a = found; a != nullptr && !mine; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    mine = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(found);
  return mine;
}

// Note [Counting restarts]
// As torchrun: --max-restarts bounds the failures of this node's workers
// (one exited non-zero, was killed, or went silent). Re-rendezvous caused by
// the membership changing is free: a node joined, a peer node's agent died
// or re-rendezvoused first (its workers failing takes ours down after it, so
// our failure then counts only if our workers failed before we saw it).
// Out of restarts, the agent closes the job for every agent.
LaunchReport run_multi_agent(LaunchOptions o, const std::string& program, SignalCapture& signals,
                             const std::function<std::string(int)>& heartbeat_dir) {
  auto say = [&](const std::string& line) { write_all(o.err_fd, line + "\n"); };
  if (o.node_id.empty()) o.node_id = default_node_id();
  const AgentStoreKind kind = agent_store_kind(o.job_token);
  o.agent_store = agent_store_name(kind);
  const std::string job = o.rdzv_id.empty() ? std::string("none") : o.rdzv_id;

  // The endpoint's agent serves the store; on a host running several agents
  // of the job (tests, trials) the first to bind it wins.
  std::unique_ptr<AgentStore> served;
  if (is_this_host(o.master_addr)) {
    AgentStoreOptions so;
    const char* bind = std::getenv("PARATRAIN_STORE_BIND");
    so.bind_address = bind != nullptr && *bind != '\0' ? bind : (is_loopback(o.master_addr) ? "127.0.0.1" : o.master_addr);
    so.port = o.master_port;
    so.token = o.job_token;
    so.job_id = job;
    try {
      served = std::make_unique<AgentStore>(so);
      say(fmt::format("paratrain launch: node '{}' serves the rendezvous store of job '{}' on {} ({})", o.node_id,
                      job, served->where(),
                      kind == AgentStoreKind::kAuthenticated ? "admits only holders of PARATRAIN_JOB_TOKEN"
                                                             : "no PARATRAIN_JOB_TOKEN: unauthenticated"));
    } catch (const CommError&) {
      say(fmt::format("paratrain launch: port {} on this host is taken; joining the store there as a client "
                      "(another agent of the job serves it)",
                      o.master_port));
    }
  }
  AgentStoreClientOptions co;
  co.host = o.master_addr;
  co.port = o.master_port;
  co.token = o.job_token;
  co.job_id = job;
  co.kind = kind;
  co.timeout = o.rdzv_timeout;
  RendezvousOptions ro;
  ro.job_id = job;
  ro.node_id = o.node_id;
  ro.nproc_per_node = o.nproc_per_node;
  ro.min_nodes = o.nnodes_min;
  ro.max_nodes = o.nnodes_max;
  ro.join_timeout = o.rdzv_timeout;
  ro.last_call = o.rdzv_last_call;
  ro.keep_alive_timeout = o.rdzv_keep_alive_timeout;
  AgentRendezvous rdzv(connect_agent_store(co), ro);

  LaunchReport report;
  std::vector<WorkerOutcome> failures;
  std::vector<int> generations, world_sizes;
  auto finish = [&](LaunchReport r, int code, const std::string& line) {
    r.exit_code = code;
    r.restarts = static_cast<int>(failures.size());
    r.failures = failures;
    r.generations = generations;
    r.world_sizes = world_sizes;
    r.summary = line;
    say(line);
    return r;
  };
  int pending_signal = 0;
  while (true) {
    Membership m;
    try {
      m = rdzv.next_round([&] { return (pending_signal = signals.take()) != 0; });
    } catch (const JobClosed& e) {
      return finish(report, e.finished ? 0 : 1, e.what());
    } catch (const AgentRendezvous::Interrupted&) {
      report.received_signal = pending_signal;
      return finish(report, 128 + pending_signal,
                    fmt::format("paratrain launch: got {} while waiting in the rendezvous; leaving the job",
                                signal_name(pending_signal)));
    } catch (const TimeoutError& e) {
      return finish(report, 1, e.what());
    }
    o.node_rank = m.node_rank;
    o.nnodes = m.nnodes();
    o.node_names = m.nodes;
    o.restart_count = m.round;
    o.heartbeat_dir = heartbeat_dir(m.round);
    generations.push_back(m.round);
    world_sizes.push_back(o.nnodes * o.nproc_per_node);
    std::string members;
    for (const auto& n : m.nodes) members += (members.empty() ? "" : ", ") + n;
    say(fmt::format("paratrain launch: rendezvous generation {} of job '{}': {} node{} ({}); node '{}' is node "
                    "rank {}, world size {}",
                    m.round, job, m.nnodes(), m.nnodes() == 1 ? "" : "s", members, o.node_id, m.node_rank,
                    o.nnodes * o.nproc_per_node));
    {
      Supervisor supervisor(o, program, signals);
      supervisor.set_interrupt([&](Supervisor::Clock::time_point now) {
        try {
          return rdzv.check(m, now);
        } catch (const std::exception& e) {
          std::string msg = e.what();
          if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
          return "lost the rendezvous store (" + msg + ")";
        }
      });
      supervisor.start();
      report = supervisor.run();
    }
    if (report.exit_code == 0) {
      rdzv.mark_done(m);
      if (served) {
        // Every member done (or the wait over): only then may the store go.
        const auto until = std::chrono::steady_clock::now() + kDoneWait;
        while (rdzv.done_count(m) < m.nnodes() && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        rdzv.close_job("it finished", true);
      }
      return finish(report, 0, report.summary + fmt::format(" (generation {}, {} restart{})", m.round,
                                                             failures.size(), failures.size() == 1 ? "" : "s"));
    }
    if (report.received_signal != 0) {
      try {
        rdzv.close_job(fmt::format("node '{}' got {}", o.node_id, signal_name(report.received_signal)), false);
      } catch (const std::exception&) {
      }
      return finish(report, report.exit_code, report.summary);
    }
    if (report.first_failed < 0) {
      say(fmt::format("paratrain launch: generation {} stopped ({}); re-rendezvousing (a membership change "
                      "does not count as a restart)",
                      m.round, report.rendezvous_stop));
      continue;
    }
    const WorkerOutcome& cause = report.workers[static_cast<std::size_t>(report.first_failed)];
    if (static_cast<int>(failures.size()) >= o.max_restarts) {
      const std::string why = fmt::format("node '{}': {} with no restarts left (--max-restarts {})", o.node_id,
                                          describe(cause), o.max_restarts);
      try {
        rdzv.close_job(why, false);
      } catch (const std::exception&) {
      }
      return finish(report, report.exit_code, report.summary + "; " + why);
    }
    failures.push_back(cause);
    say(fmt::format("paratrain launch: generation {} failed: {}; restart {} of {}: re-rendezvousing for "
                    "generation {} (`paratrain train` resumes from its latest complete checkpoint)",
                    m.round, describe(cause), failures.size(), o.max_restarts, m.round + 1));
  }
}

}  // namespace paratrain::launch

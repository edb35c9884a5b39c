// The agents' rendezvous protocol over a c10d::Store (agent_rendezvous.h).
#include "paratrain/launch/agent_rendezvous.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace paratrain::launch {
namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}
double secs(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

// Note [Multi-agent rendezvous]
// torchrun's c10d rendezvous, in rounds. Round r lives under
// paratrain-rdzv/<job>/round<r>/ in the endpoint agent's store:
// - joining: `joined` is a counter; add(joined, 1) gives the agent its
//   arrival index i, and it writes node/<i> = "<node id> <nproc>";
// - closing: every waiting agent watches `joined`. With MAX arrivals, or MIN
//   arrivals and last_call elapsed since this agent first saw MIN, it
//   compareSets `closed` from nothing to min(joined, MAX). compareSet makes
//   the first closer win; everyone then reads the same member count N, and
//   arrivals 0..N-1 are the members (ranked by node id, so a node keeps its
//   rank across rounds where it can). An arrival >= N came too late: it
//   joins round r+1 at once, which is how a new node asks to be let in.
//   Such a newcomer waits last_call + keep_alive_timeout before it would
//   close round r+1 by itself: the running members need a moment to notice
//   it, stop their workers and join, and only if they are all dead should
//   the newcomer go on alone;
// - running: members bump alive/<node id> while their workers run, and look
//   at round r+1's `joined`. Anyone there (a new node, or a member whose
//   worker failed and who re-rendezvoused) makes every member stop its
//   workers and join round r+1: torchrun's num_nodes_waiting. A member whose
//   counter stops for keep_alive_timeout is taken for dead (its agent was
//   killed with its node); the others re-rendezvous without it, since only
//   live agents join the next round;
// - `closed` at the job level (paratrain-rdzv/<job>/job_closed) ends
//   everything: an agent out of restarts, or a finished job.
// Rounds are the generations: workers of round r get
// TORCHELASTIC_RESTART_COUNT=r and key their own check-in by it
// (comm/rendezvous.cpp), so a worker of an older round is never counted.
// The store itself lives in the endpoint's agent: that node must outlive the
// job (torchrun's c10d backend has the same single host).
AgentRendezvous::AgentRendezvous(c10::intrusive_ptr<c10d::Store> store, RendezvousOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

std::string AgentRendezvous::key(int round, const std::string& what) const {
  if (round < 0) return fmt::format("paratrain-rdzv/{}/{}", options_.job_id, what);
  return fmt::format("paratrain-rdzv/{}/round{}/{}", options_.job_id, round, what);
}

bool AgentRendezvous::closed(int round, int& members) {
  const std::string k = key(round, "closed");
  if (!store_->check({k})) return false;
  members = std::stoi(text(store_->get(k)));
  return true;
}

std::vector<std::string> AgentRendezvous::read_members(int round, int members) {
  std::vector<std::pair<std::string, int>> found;
  for (int i = 0; i < members; ++i) {
    const std::string k = key(round, fmt::format("node/{}", i));
    store_->wait({k}, options_.join_timeout);
    const std::string v = text(store_->get(k));
    const auto space = v.rfind(' ');
    found.emplace_back(v.substr(0, space), std::stoi(v.substr(space + 1)));
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> nodes;
  for (const auto& [id, nproc] : found) {
    if (nproc != options_.nproc_per_node) {
      throw ConfigError(fmt::format("paratrain launch: node '{}' runs --nproc-per-node {} but node '{}' runs {}; "
                                    "every node of an elastic job must run the same number of workers",
                                    id, nproc, options_.node_id, options_.nproc_per_node));
    }
    if (!nodes.empty() && nodes.back() == id) {
      throw ConfigError(fmt::format("paratrain launch: two agents of job '{}' call themselves '{}'; give each node "
                                    "its own --node-id",
                                    options_.job_id, id));
    }
    nodes.push_back(id);
  }
  return nodes;
}

Membership AgentRendezvous::next_round(const std::function<bool()>& interrupted) {
  const auto start = Clock::now();
  for (int r = first_open_;; ++r) {
    int members = 0;
    if (closed(r, members)) continue;
    const int index = static_cast<int>(store_->add(key(r, "joined"), 1)) - 1;
    store_->set(key(r, fmt::format("node/{}", index)), bytes(fmt::format("{} {}", options_.node_id,
                                                                         options_.nproc_per_node)));
    std::optional<Clock::time_point> min_seen;
    // A newcomer (not a member of round r-1) gives the members of round r-1
    // time to notice it, stop their workers and join before it would close
    // round r on its own: see Note [Multi-agent rendezvous].
    const bool newcomer = r > 0 && last_member_round_ != r - 1;
    const auto last_call = newcomer ? options_.last_call + options_.keep_alive_timeout : options_.last_call;
    while (true) {
      if (interrupted && interrupted()) throw Interrupted("interrupted while waiting in the rendezvous");
      if (store_->check({key(-1, "job_closed")})) {
        const std::string why = text(store_->get(key(-1, "job_closed")));
        throw JobClosed(fmt::format("paratrain launch: job '{}' is over: {}", options_.job_id, why.substr(2)),
                        why.rfind("S:", 0) == 0);
      }
      if (closed(r, members)) break;
      const auto now = Clock::now();
      const int joined = static_cast<int>(store_->add(key(r, "joined"), 0));
      if (joined >= options_.min_nodes) {
        if (!min_seen) min_seen = now;
        if (joined >= options_.max_nodes || now - *min_seen >= last_call) {
          store_->compareSet(key(r, "closed"), {}, bytes(std::to_string(std::min(joined, options_.max_nodes))));
          continue;  // read back whoever's close won
        }
      } else if (now - start >= options_.join_timeout) {
        throw TimeoutError(fmt::format(
            "paratrain launch: the rendezvous of job '{}' waited {:g} s (--rdzv-timeout) for at least {} node{} "
            "(--nnodes {}:{}) but {} joined; start the other nodes' launchers with the same --rdzv-endpoint and "
            "--rdzv-id, or lower MIN",
            options_.job_id, secs(options_.join_timeout), options_.min_nodes, options_.min_nodes == 1 ? "" : "s",
            options_.min_nodes, options_.max_nodes, joined));
      }
      std::this_thread::sleep_for(options_.poll);
    }
    first_open_ = r + 1;
    if (index >= members) continue;  // closed without us: ask to be let into the next round
    Membership m;
    m.round = r;
    m.nodes = read_members(r, members);
    m.node_rank = static_cast<int>(std::find(m.nodes.begin(), m.nodes.end(), options_.node_id) - m.nodes.begin());
    watched_round_ = -1;
    last_member_round_ = r;
    return m;
  }
}

std::string AgentRendezvous::check(const Membership& m, Clock::time_point now) {
  if (now < next_check_) return {};
  next_check_ = now + options_.poll;
  store_->add(key(m.round, "alive/" + options_.node_id), 1);
  // Only a failed job stops running workers; "finished" is closed by the
  // serving agent once every member is done.
  if (store_->check({key(-1, "job_closed")})) {
    const std::string why = text(store_->get(key(-1, "job_closed")));
    if (why.rfind("F:", 0) == 0) return fmt::format("the job was closed: {}", why.substr(2));
  }
  const auto waiting = store_->add(key(m.round + 1, "joined"), 0);
  if (waiting > 0) {
    return fmt::format("{} agent{} waiting in the rendezvous for generation {} (a node joined, or one "
                       "re-rendezvoused after a failure)",
                       waiting, waiting == 1 ? " is" : "s are", m.round + 1);
  }
  if (watched_round_ != m.round) {
    watched_round_ = m.round;
    seen_.clear();
  }
  for (int rank = 0; rank < m.nnodes(); ++rank) {
    if (rank == m.node_rank) continue;
    const auto beats = store_->add(key(m.round, "alive/" + m.nodes[static_cast<std::size_t>(rank)]), 0);
    auto it = seen_.find(rank);
    if (it == seen_.end() || it->second.first != beats) {
      seen_[rank] = {beats, now};
    } else if (now - it->second.second >= options_.keep_alive_timeout) {
      return fmt::format("node '{}' (node rank {}) sent no keep-alive for {:g} s: its agent is gone",
                         m.nodes[static_cast<std::size_t>(rank)], rank,
                         std::chrono::duration<double>(now - it->second.second).count());
    }
  }
  return {};
}

void AgentRendezvous::close_job(const std::string& reason, bool finished) {
  store_->compareSet(key(-1, "job_closed"), {}, bytes((finished ? "S:" : "F:") + reason));
}

void AgentRendezvous::mark_done(const Membership& m) {
  store_->add(key(m.round, "done"), 1);
}

int AgentRendezvous::done_count(const Membership& m) {
  return static_cast<int>(store_->add(key(m.round, "done"), 0));
}

}  // namespace paratrain::launch

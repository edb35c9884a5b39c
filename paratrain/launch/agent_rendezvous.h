// The agents' rendezvous (torchrun's c10d rendezvous): the launchers of a job
// meet in the store of the endpoint's agent (agent_store.h), agree on a
// generation (a "round"), which nodes are in it, their node ranks and so the
// world size; while workers run they keep themselves alive in the store and
// notice when another agent has moved on to the next round. Only the
// protocol over a c10d::Store: the agent loop that starts and stops workers
// is elastic_agent.cpp. Note [Multi-agent rendezvous] in the .cpp.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include "paratrain/core/error.h"

namespace c10d {
class Store;
}

namespace paratrain::launch {

struct RendezvousOptions {
  std::string job_id = "none";  // namespaces every key: two jobs never mix
  std::string node_id;          // unique per agent; members are ranked by it
  int nproc_per_node = 1;       // every node of the job must run as many
  int min_nodes = 1;
  int max_nodes = 1;
  // torchrun's join_timeout and last_call_timeout (launcher.h).
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds last_call{std::chrono::seconds(10)};
  // A member whose keep-alive counter has not moved for this long is dead.
  std::chrono::milliseconds keep_alive_timeout{std::chrono::seconds(15)};
  // How often waiting agents poll the store. Shorter reacts sooner, costs
  // more requests to the endpoint's agent.
  std::chrono::milliseconds poll{100};
};

// One closed round as this agent sees it.
struct Membership {
  int round = -1;                  // the generation: TORCHELASTIC_RESTART_COUNT of its workers
  int node_rank = -1;              // this agent's rank among the members
  std::vector<std::string> nodes;  // members' node ids, in node-rank order
  int nnodes() const { return static_cast<int>(nodes.size()); }
};

// The job was closed by an agent that gave up (or finished): nothing to join.
struct JobClosed : Error {
  bool finished = false;  // closed because the job succeeded
  JobClosed(const std::string& what, bool done) : Error(what), finished(done) {}
};

class AgentRendezvous {
 public:
  using Clock = std::chrono::steady_clock;

  AgentRendezvous(c10::intrusive_ptr<c10d::Store> store, RendezvousOptions options);

  // Joins the first round not yet closed and waits until it closes; joins
  // the next one when it closed without this agent. Throws TimeoutError when
  // fewer than min_nodes joined within join_timeout, JobClosed when the job
  // was closed, ConfigError when a member runs another nproc_per_node, and
  // Interrupted (below) when `interrupted` returns true.
  Membership next_round(const std::function<bool()>& interrupted = {});

  // While this agent's workers run in `m`'s round: bumps this agent's
  // keep-alive and says why it must stop its workers and re-rendezvous, or
  // "" to go on: agents waiting in the next round (a node joined, or a
  // member re-rendezvoused after a failure), a member silent for
  // keep_alive_timeout, the job closed. Throttled to one look per poll.
  std::string check(const Membership& m, Clock::time_point now);

  // Tells every agent to stop: failed (out of restarts, a timeout) or
  // finished (finished = true). The first reason set wins.
  void close_job(const std::string& reason, bool finished);
  // This agent's workers finished in `m`'s round.
  void mark_done(const Membership& m);
  // Members of `m` that said done (the serving agent waits for them before
  // it takes the store down).
  int done_count(const Membership& m);

  struct Interrupted : Error {
    using Error::Error;
  };

 private:
  std::string key(int round, const std::string& what) const;
  bool closed(int round, int& members);
  std::vector<std::string> read_members(int round, int members);

  c10::intrusive_ptr<c10d::Store> store_;
  RendezvousOptions options_;
  int first_open_ = 0;  // rounds below it are known to be closed
  int last_member_round_ = -1;
  // Keep-alive bookkeeping of the current round: last counter value and when it changed.
  int watched_round_ = -1;
  std::map<int, std::pair<std::int64_t, Clock::time_point>> seen_;
  Clock::time_point next_check_{};
};

}  // namespace paratrain::launch

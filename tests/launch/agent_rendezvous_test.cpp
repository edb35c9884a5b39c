// The agents' rendezvous state machine (launch/agent_rendezvous.h) without
// processes: agents are threads meeting in one in-process c10d HashStore.
#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "paratrain/launch/agent_rendezvous.h"

namespace paratrain::launch {
namespace {

using namespace std::chrono_literals;

RendezvousOptions agent(const std::string& id, int min, int max) {
  RendezvousOptions o;
  o.job_id = "job";
  o.node_id = id;
  o.min_nodes = min;
  o.max_nodes = max;
  o.join_timeout = 20s;
  o.last_call = 200ms;
  o.keep_alive_timeout = 300ms;
  o.poll = 10ms;
  return o;
}

// Calls check() until it gives a reason (or `limit` passes: then "").
std::string check_until_reason(AgentRendezvous& r, const Membership& m, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    auto why = r.check(m, std::chrono::steady_clock::now());
    if (!why.empty()) return why;
    std::this_thread::sleep_for(5ms);
  }
  return {};
}

TEST(AgentRendezvous, MaxNodesCloseTheRoundAndNodesAreRankedById) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  AgentRendezvous a(store, agent("node-b", 1, 2)), b(store, agent("node-a", 1, 2));
  auto fa = std::async(std::launch::async, [&] { return a.next_round(); });
  auto mb = b.next_round();
  auto ma = fa.get();
  EXPECT_EQ(ma.round, 0);
  EXPECT_EQ(mb.round, 0);
  EXPECT_EQ(ma.nodes, (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(ma.nodes, mb.nodes);
  EXPECT_EQ(mb.node_rank, 0);
  EXPECT_EQ(ma.node_rank, 1);
}

TEST(AgentRendezvous, MinNodesCloseAfterTheLastCall) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  AgentRendezvous a(store, agent("a", 1, 3));
  const auto m = a.next_round();
  EXPECT_EQ(m.nnodes(), 1);
  EXPECT_EQ(m.node_rank, 0);
}

TEST(AgentRendezvous, TooFewNodesIsATimeoutNamingTheCounts) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto o = agent("a", 2, 3);
  o.join_timeout = 200ms;
  AgentRendezvous a(store, o);
  try {
    a.next_round();
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("for at least 2 nodes (--nnodes 2:3) but 1 joined"), std::string::npos)
        << e.what();
  }
}

TEST(AgentRendezvous, ANodeArrivingLateMakesTheMembersReRendezvousAsTheNextGeneration) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  AgentRendezvous a(store, agent("a", 1, 2)), b(store, agent("b", 1, 2));
  const auto m0 = a.next_round();
  ASSERT_EQ(m0.nnodes(), 1);
  // Control: nobody waiting, nobody silent: the member goes on.
  EXPECT_EQ(a.check(m0, std::chrono::steady_clock::now()), "");
  auto fb = std::async(std::launch::async, [&] { return b.next_round(); });
  const auto why = check_until_reason(a, m0);
  EXPECT_NE(why.find("waiting in the rendezvous for generation 1"), std::string::npos) << why;
  const auto m1 = a.next_round();
  const auto mb = fb.get();
  EXPECT_EQ(m1.round, 1);
  EXPECT_EQ(mb.round, 1);
  EXPECT_EQ(m1.nodes, (std::vector<std::string>{"a", "b"}));
}

TEST(AgentRendezvous, AMemberWithoutKeepAlivesIsTakenForDead) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  AgentRendezvous a(store, agent("a", 1, 2)), b(store, agent("b", 1, 2));
  auto fb = std::async(std::launch::async, [&] { return b.next_round(); });
  const auto m = a.next_round();
  fb.get();
  // b beats for a while: not dead.
  const auto until = std::chrono::steady_clock::now() + 600ms;
  while (std::chrono::steady_clock::now() < until) {
    b.check(m, std::chrono::steady_clock::now());
    EXPECT_EQ(a.check(m, std::chrono::steady_clock::now()), "");
    std::this_thread::sleep_for(5ms);
  }
  // Then b stops (its agent was killed): a notices.
  const auto why = check_until_reason(a, m);
  EXPECT_NE(why.find("node 'b' (node rank 1) sent no keep-alive"), std::string::npos) << why;
  // The survivor's next generation has only itself.
  const auto m1 = a.next_round();
  EXPECT_EQ(m1.round, 1);
  EXPECT_EQ(m1.nodes, std::vector<std::string>{"a"});
}

TEST(AgentRendezvous, AFailedJobStopsTheOthersAndAFinishedOneTurnsLateComersAway) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  AgentRendezvous a(store, agent("a", 1, 2)), b(store, agent("b", 1, 2));
  auto fb = std::async(std::launch::async, [&] { return b.next_round(); });
  const auto m = a.next_round();
  fb.get();
  b.close_job("node 'b' ran out of restarts", false);
  EXPECT_NE(check_until_reason(a, m).find("the job was closed: node 'b' ran out of restarts"), std::string::npos);
  try {
    a.next_round();
    FAIL() << "joined a closed job";
  } catch (const JobClosed& e) {
    EXPECT_FALSE(e.finished);
  }

  auto other = c10::make_intrusive<c10d::HashStore>();
  AgentRendezvous c(other, agent("c", 1, 2)), d(other, agent("d", 1, 2));
  const auto mc = c.next_round();
  c.close_job("it finished", true);
  EXPECT_EQ(c.check(mc, std::chrono::steady_clock::now()), "");  // finished: running workers go on
  try {
    d.next_round();
    FAIL() << "joined a finished job";
  } catch (const JobClosed& e) {
    EXPECT_TRUE(e.finished);
  }
}

TEST(AgentRendezvous, NodesMustRunTheSameNumberOfWorkers) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto oa = agent("a", 2, 2), ob = agent("b", 2, 2);
  ob.nproc_per_node = 3;
  AgentRendezvous a(store, oa), b(store, ob);
  auto fb = std::async(std::launch::async, [&] {
    try {
      b.next_round();
    } catch (const ConfigError&) {
    }
  });
  EXPECT_THROW(a.next_round(), ConfigError);
  fb.get();
}

}  // namespace
}  // namespace paratrain::launch

// Failures at start-up, with real processes (tests/worker/main.cpp): a job in
// which every rank failed is a failed launch even under --keep-going; a rank
// that dies before the others met it ends their check-in at once instead of
// after world.timeout_s, and one that dies after it their connection setup;
// a process without the job's token that meets its store gets one line
// saying why it is refused instead of c10d's crash, also when the store's
// greeting comes later than the probe waits.
// Bounds are generous timeouts that fail the test when hit, never timings.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/wait.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "launch_test_util.h"
#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/launch/agent_store.h"
#include "paratrain/launch/free_port.h"
#include "paratrain/launch/launcher.h"
#include "tests/support/multi_rank.h"
#include "tests/support/spawn.h"

namespace paratrain::launch {
namespace {

using test::run_captured;
using test::worker;

LaunchOptions keep_going_options(std::vector<std::string> steps) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.keep_going = true;
  o.keep_going_rank0 = true;
  o.command = worker(std::move(steps));
  o.kill_grace = std::chrono::milliseconds(2000);
  return o;
}

// --keep-going --keep-going-rank0 tolerates each failure in turn; when the
// last rank fails too, nobody succeeded and the launch must say so. The
// control where one rank survives is
// Launch.KeepGoingLetsTheOthersFinishWhenARankOtherThanZeroDies.
TEST(StartFailure, KeepGoingWithEveryRankFailedIsAFailedLaunch) {
  const auto dir = testing::temp_dir("start-all-failed");
  const auto c = run_captured(keep_going_options({"fail-rank", "0", "3", "fail-rank", "1", "4"}), dir);
  EXPECT_TRUE(c.report.exit_code == 3 || c.report.exit_code == 4) << c.err;
  EXPECT_TRUE(c.report.workers[0].tolerated && c.report.workers[1].tolerated) << c.err;
  EXPECT_EQ(c.report.summary.rfind("paratrain launch: FAILED with exit code ", 0), 0u) << c.report.summary;
  EXPECT_NE(c.report.summary.find("no rank succeeded"), std::string::npos) << c.report.summary;
  EXPECT_EQ(c.report.summary.find("succeeded (none)"), std::string::npos) << c.report.summary;
}

// A rank dead at start-up: rank 1 dies before it checks in, or after it but
// before it published its Gloo address (Note [Ending a check-in] in
// comm/store_checkin.cpp). Either way rank 0 would wait its whole 120 s
// timeout for it. The launcher saw the death and ends the rendezvous: rank
// 0 stops naming it, and (item above) the launch fails with rank 1 as the
// cause. The 120 s are a guard: hitting it fails the message checks.
void expect_the_rendezvous_ended(const std::vector<std::string>& death, const std::string& where) {
  const auto dir = testing::temp_dir("start-dead");
  std::vector<std::string> steps{"on-rank", "1"};
  steps.insert(steps.end(), death.begin(), death.end());
  steps.insert(steps.end(), {"rendezvous", "120"});
  const auto c = run_captured(keep_going_options(steps), dir);
  const std::string log = c.out + c.err;
  ASSERT_EQ(c.report.workers.size(), 2u) << log;
  EXPECT_EQ(c.report.workers[1].signal, SIGKILL) << log;
  EXPECT_EQ(c.report.workers[0].exit_code, 1) << log;
  EXPECT_NE(log.find(fmt::format("was ended {}: the launcher saw a peer fail: rank 1 (pid {}) was killed by SIGKILL",
                                 where, c.report.workers[1].pid)),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("never arrived"), std::string::npos) << log;
  EXPECT_EQ(log.find("rendezvous done"), std::string::npos) << log;
  EXPECT_EQ(c.report.exit_code, 128 + SIGKILL) << log;
  EXPECT_EQ(c.report.first_failed, 1) << log;
}

TEST(StartFailure, ARankDeadBeforeTheRendezvousEndsTheOthersCheckIn) {
  expect_the_rendezvous_ended({"kill-self", "9"}, "before every rank arrived");
}

TEST(StartFailure, ARankDeadAfterItsCheckInEndsTheOthersConnectionSetup) {
  expect_the_rendezvous_ended({"die-after-check-in", "120"}, "while this rank was connecting to its peers");
}

// The same deaths under elastic.in_job's rendezvous: before its check-in
// and after it. Ranks 0 and 2 of 3 do not stop: they build the world
// between themselves as ranks 0 and 1 (Note [Shrinking at start-up] in
// comm/rendezvous.cpp); InJobLaunch.* does it through `paratrain train`.
TEST(StartFailure, UnderInJobRecoveryTheOthersStartWithoutARankDeadAtStartUp) {
  for (const char* death : {"kill-self", "die-after-check-in"}) {
    const auto dir = testing::temp_dir("start-dead-in-job");
    auto o = keep_going_options({"on-rank", "1", death, std::string(death) == "kill-self" ? "9" : "120",
                                 "elastic-rendezvous", "120"});
    o.nproc_per_node = 3;
    const auto c = run_captured(o, dir);
    const std::string log = c.out + c.err;
    ASSERT_EQ(c.report.workers.size(), 3u) << death << "\n" << log;
    EXPECT_EQ(c.report.workers[1].signal, SIGKILL) << death << "\n" << log;
    for (int r : {0, 2}) EXPECT_TRUE(c.report.workers[r].ok()) << death << ": rank " << r << "\n" << log;
    for (const char* line : {"rendezvous done: rank 0 of 2", "rendezvous done: rank 1 of 2"})
      EXPECT_NE(log.find(line), std::string::npos) << death << ": " << line << "\n" << log;
    EXPECT_NE(log.find("rank(s) 1 of 3 died before the world was built"), std::string::npos) << death << "\n"
                                                                                              << log;
  }
}

// A hand-started rank without PARATRAIN_JOB_TOKEN meets a job's
// authenticated store: c10d's TCPStore client would read the greeting as a
// length and die in std::bad_alloc (exit 134, no message). It must exit 1
// with one line saying why. `timeout 120` is the guard.
TEST(StartFailure, AProcessWithoutTheTokenIsRefusedInOneLine) {
  if (!comm::auth::available()) GTEST_SKIP() << "built without libsodium: no authenticated store";
  AgentStoreOptions so;
  so.port = find_free_port();
  so.token = "the-jobs-secret";
  AgentStore store(so);
  const std::string cmd = fmt::format(
      "env -u PARATRAIN_JOB_TOKEN -u TORCHELASTIC_USE_AGENT_STORE -u PARATRAIN_AGENT_STORE RANK=1 WORLD_SIZE=2 "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT={} timeout 120 {} rendezvous 60 2>&1",
      so.port, PARATRAIN_TEST_WORKER);
  const auto [status, output] = paratrain::testing::run_shell(cmd);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 1) << output;
  EXPECT_EQ(test::lines_of(output).size(), 1u) << output;
  for (const char* words : {"refused this process", "authenticated store", "PARATRAIN_JOB_TOKEN is not set",
                            "--plain-store"}) {
    EXPECT_NE(output.find(words), std::string::npos) << words << "\n" << output;
  }
}

}  // namespace
}  // namespace paratrain::launch

namespace paratrain::launch {
namespace {

// A server that, like a starved authenticated store, greets 1.5 s after it
// accepts: longer than the probe waits. It answers nothing else.
class LateGreeter {
 public:
  LateGreeter() : port_(find_free_port()) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) port_ = -1;
    thread_ = std::thread([this] { serve(); });
  }
  ~LateGreeter() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void serve() {
    std::vector<std::thread> connections;
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      connections.emplace_back([this, c] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        std::string hello(comm::auth::kMagic);
        hello += std::string(32, '\x5a');
        [[maybe_unused]] const ssize_t sent = ::send(c, hello.data(), hello.size(), MSG_NOSIGNAL);
        char buf[256];
        while (!stop_) {  // until the client goes
          pollfd q{c, POLLIN, 0};
          if (::poll(&q, 1, 100) > 0 && ::recv(c, buf, sizeof buf, 0) <= 0) break;
        }
        ::close(c);
      });
    }
    for (auto& t : connections) t.join();
  }
  int port_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Note [A greeting that came late] in comm/store_connect.cpp: the probe
// takes a store that greets after its second for c10d's TCPStore, whose
// client then reads the greeting as a reply and fails in std::bad_alloc,
// in its own thread (std::terminate) or in ours. Either way the process
// says why in one line first, instead of only "terminate called after
// throwing an instance of 'std::bad_alloc'".
TEST(StartFailure, AGreetingLaterThanTheProbeStillSaysWhyTheStoreFailed) {
  LateGreeter server;
  ASSERT_GT(server.port(), 0);
  const std::string cmd = fmt::format(
      "env -u PARATRAIN_JOB_TOKEN -u TORCHELASTIC_USE_AGENT_STORE -u PARATRAIN_AGENT_STORE RANK=1 WORLD_SIZE=2 "
      "MASTER_ADDR=127.0.0.1 MASTER_PORT={} timeout 120 {} rendezvous 20 2>&1",
      server.port(), PARATRAIN_TEST_WORKER);
  const auto [status, output] = paratrain::testing::run_shell(cmd);
  ASSERT_NE(status, -1);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 124) << "hit the guard:\n" << output;
  EXPECT_NE(output.find("most likely served by a paratrain job's authenticated store whose greeting came after "
                        "the probe's 1 s"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace paratrain::launch

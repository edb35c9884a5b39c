// Failures at start-up, with real processes (tests/worker/main.cpp): a job in
// which every rank failed is a failed launch even under --keep-going; a rank
// that dies before the others met it ends their check-in at once instead of
// after world.timeout_s; a process without the job's token that meets its
// store gets one line saying why it is refused instead of c10d's crash.
// Bounds are generous timeouts that fail the test when hit, never timings.
#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "launch_test_util.h"
#include "paratrain/comm/auth_store/handshake.h"
#include "paratrain/launch/agent_store.h"
#include "paratrain/launch/free_port.h"
#include "paratrain/launch/launcher.h"
#include "tests/support/multi_rank.h"

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

// Rank 1 dies before it checks in; rank 0 would wait its whole 120 s
// timeout for it. The launcher saw the death and ends the check-in: rank 0
// stops naming it, and (item above) the launch fails with rank 1 as the
// cause. The 120 s are a guard: hitting it fails the message checks.
TEST(StartFailure, ARankDeadBeforeTheRendezvousEndsTheOthersCheckIn) {
  const auto dir = testing::temp_dir("start-dead-before-checkin");
  const auto c = run_captured(keep_going_options({"on-rank", "1", "kill-self", "9", "rendezvous", "120"}), dir);
  const std::string log = c.out + c.err;
  ASSERT_EQ(c.report.workers.size(), 2u) << log;
  EXPECT_EQ(c.report.workers[1].signal, SIGKILL) << log;
  EXPECT_EQ(c.report.workers[0].exit_code, 1) << log;
  EXPECT_NE(log.find(fmt::format("was ended before every rank arrived: the launcher saw a peer fail: rank 1 (pid "
                                 "{}) was killed by SIGKILL",
                                 c.report.workers[1].pid)),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("never arrived"), std::string::npos) << log;
  EXPECT_EQ(c.report.exit_code, 128 + SIGKILL) << log;
  EXPECT_EQ(c.report.first_failed, 1) << log;
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
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) output += buf;
  const int status = pclose(p);
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

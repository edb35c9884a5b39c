// Heartbeats end to end, with real processes on purpose: what is tested is a
// process that freezes (SIGSTOP, PARATRAIN_FAULT_STOP) while its peer blocks
// in a collective with a long timeout, and a launcher that notices, names the
// rank and its last collective, collects the hang doctor's dumps and fails the
// job. Short heartbeat values keep it quick; nothing asserts on time (a missed
// detection would hang until world.timeout_s and fail on the messages).
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch_test_util.h"
#include "paratrain/launch/launcher.h"
#include "tests/support/multi_rank.h"

namespace paratrain::launch {
namespace {

namespace fs = std::filesystem;
using test::run_captured;
using test::ScopedEnv;

// 12 steps of a small MLP on synthetic 8x8 images (as the elastic tests), a
// heartbeat every 0.1 s and a 2 s heartbeat timeout, but a collective timeout
// of 10 minutes: only the heartbeats can end a hang quickly.
std::string write_config(const std::string& dir) {
  return test::write_small_mlp_config(dir, "heartbeat.toml", "hb", 128, 16, test::kHeartbeatSections);
}

LaunchOptions job(const std::string& dir) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.kill_grace = std::chrono::milliseconds(2000);
  o.command = {PARATRAIN_CLI, "train", "-c", write_config(dir), "--set", "run.output_dir=" + dir + "/out"};
  return o;
}

TEST(HeartbeatLaunch, AStoppedRankIsNamedWithItsLastCollectiveAndLeavesDoctorFiles) {
  const std::string dir = testing::temp_dir("heartbeat_stop");
  test::Captured c;
  {
    ScopedEnv stop("PARATRAIN_FAULT_STOP", "1:3");
    c = run_captured(job(dir), dir);
  }
  const std::string log = c.out + c.err;
  EXPECT_NE(c.report.exit_code, 0) << log;
  ASSERT_EQ(c.report.first_failed, 1) << log;
  const WorkerOutcome& stopped = c.report.workers[1];
  static const std::regex named(
      R"(rank 1 \(pid \d+\) sent no heartbeat for [0-9.]+ s \(world\.heartbeat_timeout_s = 2 s; the process is )"
      R"(stopped \(SIGSTOP, or a debugger\)\); its last collective: \w+ #\d+ on world \[0,1\])");
  EXPECT_TRUE(std::regex_search(log, named)) << log;
  EXPECT_NE(stopped.hang.find("sent no heartbeat"), std::string::npos) << stopped.hang;
  EXPECT_NE(c.report.summary.find("FAILED with exit code 137: rank 1 (pid " + std::to_string(stopped.pid) +
                                  ") sent no heartbeat"),
            std::string::npos)
      << log;

  // The doctor's files: rank 0 dumped on the launcher's SIGUSR1 while
  // blocked in a collective; rank 1's last heartbeat was saved for it.
  const fs::path doctor = fs::path(dir) / "out" / "hb" / "version_0" / "doctor";
  ASSERT_TRUE(fs::exists(doctor / "rank-0.json")) << log;
  ASSERT_TRUE(fs::exists(doctor / "rank-1.json")) << log;
  EXPECT_NE(test::slurp((doctor / "rank-0.json").string()).find("\"reason\": \"SIGUSR1\""), std::string::npos);
  EXPECT_NE(test::slurp((doctor / "rank-1.json").string()).find("\"reason\": \"heartbeat\""), std::string::npos);

  // And the doctor reads them: rank 1 is behind, rank 0 waits one collective further.
  const auto diagnosis = testing::run_cli({"doctor", "--run", doctor.parent_path().string(), "--no-signal"});
  EXPECT_EQ(diagnosis.exit_code, 1) << diagnosis.output;
  static const std::regex behind(R"(rank 1 (finished|is in) \w+ #(\d+).* while rank 0 waits in \w+ #(\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(diagnosis.output, m, behind)) << diagnosis.output;
  EXPECT_GT(std::stoll(m[3]), std::stoll(m[2])) << diagnosis.output;
  EXPECT_TRUE(fs::exists(doctor / "trace.json")) << diagnosis.output;
}

// The exit code says why (kPeerLostExitCode, core/exit_codes.h): rank 1
// kills itself at step 5; with --keep-going the launcher leaves rank 0 to
// notice on its own, and it exits 69 ("a peer was lost"), not 1. The
// summary names rank 1's SIGKILL first.
TEST(HeartbeatLaunch, TheRankThatLostAPeerExitsWithThePeerLostCode) {
  const std::string dir = testing::temp_dir("heartbeat_peer_lost");
  test::Captured c;
  {
    ScopedEnv kill("PARATRAIN_FAULT_KILL", "1:5");
    auto o = job(dir);
    o.keep_going = true;
    o.keep_going_rank0 = true;
    c = run_captured(o, dir);
  }
  const std::string log = c.out + c.err;
  ASSERT_EQ(c.report.workers.size(), 2u) << log;
  EXPECT_FALSE(c.report.workers[1].exited) << log;  // SIGKILL
  EXPECT_TRUE(c.report.workers[0].exited) << log;
  EXPECT_EQ(c.report.workers[0].exit_code, kPeerLostExitCode) << log;
  EXPECT_NE(log.find("exited with code 69 (a peer was lost)"), std::string::npos) << log;
}

// Control: the same short heartbeats on a healthy run never fire.
TEST(HeartbeatLaunch, ControlAHealthyRunWithTheSameHeartbeatsSucceeds) {
  const std::string dir = testing::temp_dir("heartbeat_ok");
  const auto c = run_captured(job(dir), dir);
  const std::string log = c.out + c.err;
  EXPECT_EQ(c.report.exit_code, 0) << log;
  EXPECT_EQ(log.find("sent no heartbeat"), std::string::npos) << log;
}

}  // namespace
}  // namespace paratrain::launch

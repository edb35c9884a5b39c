// The ranks' own heartbeat watch (comm/peer_watch.h) in a job no launcher
// watches: two `paratrain train` processes started by hand (the environment
// torchrun would give them, no PARATRAIN_HEARTBEAT_DIR), rank 1 SIGSTOPs
// itself (PARATRAIN_FAULT_STOP) and rank 0, blocked in a collective with a
// 10-minute timeout, must fail naming rank 1 as stopped. Real processes on
// purpose: a real SIGSTOP stops every thread of the process, the watch's
// included. Nothing asserts on time: a missed detection would leave rank 0
// waiting until the test's own deadline and fail on the messages.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launch_test_util.h"
#include "paratrain/launch/free_port.h"
#include "paratrain/launch/spawn.h"
#include "tests/support/multi_rank.h"

extern char** environ;

namespace paratrain::launch {
namespace {

using namespace std::chrono_literals;

// As tests/launch/heartbeat_test.cpp: a small MLP on synthetic images,
// heartbeats every 0.1 s, silent after 2 s, collectives that wait 10 minutes.
std::string write_config(const std::string& dir) {
  return test::write_small_mlp_config(dir, "peer_heartbeat.toml", "phb", 128, 16, test::kHeartbeatSections);
}

// This process's environment without anything a launcher would have set,
// plus torchrun's variables for `rank` of 2.
std::vector<std::string> hand_started_env(int rank, int port, bool stop_rank_one) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (key.rfind("PARATRAIN_", 0) == 0 || key.rfind("TORCHELASTIC_", 0) == 0 || key == "RANK" ||
        key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" || key == "MASTER_ADDR" ||
        key == "MASTER_PORT")
      continue;
    env.push_back(kv);
  }
  for (const auto& kv : {"RANK=" + std::to_string(rank), std::string("WORLD_SIZE=2"), "LOCAL_RANK=" + std::to_string(rank),
                         std::string("LOCAL_WORLD_SIZE=2"), std::string("MASTER_ADDR=127.0.0.1"),
                         "MASTER_PORT=" + std::to_string(port), std::string("OMP_NUM_THREADS=1")})
    env.push_back(kv);
  if (stop_rank_one) env.emplace_back("PARATRAIN_FAULT_STOP=1:3");
  return env;
}

struct Job {
  int exit0 = -1;  // rank 0's exit code (-1: killed at the deadline)
  pid_t pid1 = 0;
  std::string log0;
};

Job run_hand_started(const std::string& dir, bool stop_rank_one) {
  const std::string config = write_config(dir);
  const int port = find_free_port();
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    const std::string log = dir + "/rank" + std::to_string(r) + ".log";
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    SpawnSpec spec;
    spec.path = PARATRAIN_CLI;
    spec.argv = {PARATRAIN_CLI, "train", "-c", config, "--set", "run.output_dir=" + dir + "/out"};
    spec.env = hand_started_env(r, port, stop_rank_one);
    spec.stdout_fd = fd;
    spec.stderr_fd = fd;
    pids[r] = spawn_in_new_group(spec);
    close(fd);
  }
  Job job;
  job.pid1 = pids[1];
  // The test's own safety net (never an assertion on time): rank 0 should
  // fail within seconds; after 5 minutes it is killed and the test fails.
  const auto deadline = std::chrono::steady_clock::now() + 5min;
  int status = 0;
  while (waitpid(pids[0], &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      signal_group(pids[0], SIGKILL);
      waitpid(pids[0], &status, 0);
      break;
    }
    std::this_thread::sleep_for(50ms);
  }
  if (WIFEXITED(status)) job.exit0 = WEXITSTATUS(status);
  // Rank 1 is stopped (or done): SIGKILL ends either.
  if (stop_rank_one) signal_group(pids[1], SIGKILL);
  waitpid(pids[1], &status, 0);
  job.log0 = test::slurp(dir + "/rank0.log");
  return job;
}

TEST(PeerHeartbeat, AHandStartedJobFailsRankZeroNamingTheStoppedRankOne) {
  const std::string dir = testing::temp_dir("peer_heartbeat_stop");
  const Job job = run_hand_started(dir, true);
  EXPECT_NE(job.exit0, 0) << job.log0;
  EXPECT_NE(job.exit0, -1) << "rank 0 did not fail on its own\n" << job.log0;
  const std::regex named("rank 1 \\(pid " + std::to_string(job.pid1) +
                         " on host [^,]+, 127\\.0\\.0\\.1\\) sent no heartbeat for [0-9.]+ s "
                         "\\(world\\.heartbeat_timeout_s = 2 s; the process is stopped \\(SIGSTOP, or a debugger\\)\\); "
                         "its last collective: \\w+ #\\d+ on world \\[0,1\\]");
  EXPECT_TRUE(std::regex_search(job.log0, named)) << job.log0;
  // The error that ends rank 0 is the aborted collective's, carrying the verdict.
  EXPECT_NE(job.log0.find("rank 0: peer heartbeats: rank 1"), std::string::npos) << job.log0;
  // The doctor's dump of rank 0, as on a collective timeout.
  EXPECT_TRUE(std::filesystem::exists(dir + "/out/phb/version_0/doctor/rank-0.json")) << job.log0;
}

// Control: the same job undisturbed finishes, and nobody was blamed.
TEST(PeerHeartbeat, ControlTheSameHandStartedJobUndisturbedSucceeds) {
  const std::string dir = testing::temp_dir("peer_heartbeat_ok");
  const Job job = run_hand_started(dir, false);
  EXPECT_EQ(job.exit0, 0) << job.log0;
  EXPECT_EQ(job.log0.find("sent no heartbeat"), std::string::npos) << job.log0;
  EXPECT_NE(job.log0.find("peer heartbeats: every rank beats"), std::string::npos) << job.log0;
}

}  // namespace
}  // namespace paratrain::launch

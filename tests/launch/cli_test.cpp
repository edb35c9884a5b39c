// `paratrain launch` end to end through build/paratrain: flags map onto the
// library, bad flags are errors with every value named, the exit code is the
// failing rank's, and SIGTERM sent to the launcher process is forwarded.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launch_test_util.h"
#include "tests/support/multi_rank.h"
#include "tests/support/spawn.h"

extern char** environ;

namespace paratrain::launch {
namespace {

using testing::run_cli;

std::vector<std::string> cli_launch(std::vector<std::string> flags, std::vector<std::string> steps) {
  std::vector<std::string> args{"launch"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back("--");
  for (auto& s : test::worker(std::move(steps))) args.push_back(std::move(s));
  return args;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(LaunchCli, RunsEveryRankAndPrefixesItsOutput) {
  const auto r = run_cli(cli_launch({"--nproc-per-node", "2"}, {"print", "2"}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"[0]: out 0 0\n", "[0]: out 0 1\n", "[1]: out 1 1\n", "[0]: err 0 1\n",
                           "[1]: err 1 0\n", "paratrain launch: all 2 ranks succeeded (ranks 0-1)\n"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << " missing from:\n" << r.output;
  }
}

TEST(LaunchCli, AcceptsTorchrunSpellingsAndMultiNodeFlags) {
  const auto r = run_cli(cli_launch({"--nproc_per_node", "1", "--nnodes", "3", "--node_rank", "2",
                                     "--master_addr", "10.9.8.7", "--master_port", "29999"},
                                    {"env"}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"[2]: RANK=2\n", "[2]: WORLD_SIZE=3\n", "[2]: NODE_RANK=2\n", "[2]: LOCAL_RANK=0\n",
                           "[2]: MASTER_ADDR=10.9.8.7\n", "[2]: MASTER_PORT=29999\n"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << " missing from:\n" << r.output;
  }
}

TEST(LaunchCli, BadOptionsAreConfigurationErrorsNamingEveryValue) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string w = PARATRAIN_TEST_WORKER;
  // One case per kind of check; options_test.cpp covers every message of validate().
  const std::vector<Case> cases = {
      {{"launch", "--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1", "--", w},
       "--node-rank 2 must be >= 0 and < --nnodes 2"},
      {{"launch", "--kill-grace", "-2", "--", w}, "--kill-grace -2 s must be >= 0"},
      {{"launch", "--nproc-per-node", "2"}, "no program to launch: put it after `--`"},
      {{"launch", "--", "no-such-program-xyz"}, "cannot launch 'no-such-program-xyz'"},
      {{"launch", "--nproc-per-node", "100000000", "--", w}, "--nproc-per-node 100000000 is more than the 4096"},
      // Elastic flags: parsed as torchrun has them; MIN > 1 needs the agents' rendezvous (--rdzv-endpoint).
      {{"launch", "--nnodes", "2:3", "--", w}, "needs a multi-agent rendezvous"},
      {{"launch", "--nnodes", "x", "--", w}, "--nnodes 'x' must be a node count N or a range MIN:MAX"},
      {{"launch", "--rdzv-endpoint", "h:", "--", w}, "the port after ':' is missing"},
      {{"launch", "--max-restarts", "-1", "--", w}, "--max-restarts -1 must be >= 0"},
  };
  for (const auto& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "paratrain: configuration error: ")) << r.output;
    EXPECT_TRUE(contains(r.output, c.message)) << "expected '" << c.message << "' in:\n" << r.output;
  }
}

TEST(LaunchCli, ExitsWithTheFailingRanksCodeQuickly) {
  const auto r = run_cli(cli_launch({"--nproc-per-node", "2"}, {"fail-rank", "0", "7", "sleep", "60"}));
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_LT(r.seconds, 30.0);  // vs the 60 s sleep: loose, the machine may be loaded
  EXPECT_TRUE(contains(r.output, "FAILED with exit code 7: rank 0 (pid ")) << r.output;
}

TEST(LaunchCli, SigtermToTheLauncherStopsItAndEveryWorker) {
  const auto dir = testing::temp_dir("launch-cli-term");
  const std::string pids = dir + "/pids", log = dir + "/log";
  std::vector<std::string> args{PARATRAIN_CLI};
  for (auto& a : cli_launch({"--nproc-per-node", "2"}, {"pidfile", pids, "sleep", "60"})) args.push_back(a);
  const pid_t launcher = testing::spawn_logged(args, log);
  ASSERT_GT(launcher, 0);

  const bool started = test::wait_for_lines(pids, 2);
  const auto sent = std::chrono::steady_clock::now();
  kill(launcher, SIGTERM);
  // Bounded wait: a hung launcher fails the test instead of hanging it.
  const auto exit = testing::wait_exit(launcher, std::chrono::seconds(15));
  if (!exit) FAIL() << "launcher still running 15 s after SIGTERM:\n" << test::slurp(log);
  const int status = *exit;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  ASSERT_TRUE(started) << test::slurp(log);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << test::slurp(log);
  EXPECT_LT(took, 10.0);
  EXPECT_TRUE(contains(test::slurp(log), "interrupted by SIGTERM")) << test::slurp(log);
  for (int pid : test::read_pids(pids)) EXPECT_FALSE(test::process_alive(pid)) << pid;
}

}  // namespace
}  // namespace paratrain::launch

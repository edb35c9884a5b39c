// launch() with real worker processes (tests/worker/main.cpp): output
// prefixing, the environment each rank sees, failure propagation with exit
// codes and signals, SIGTERM escalation, grandchildren, signal forwarding.
#include <sys/stat.h>

#include <csignal>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "paratrain/core/error.h"
#include "paratrain/launch/launcher.h"
#include "launch_test_util.h"
#include "tests/support/multi_rank.h"

namespace paratrain::launch {
namespace {

using test::lines_of;
using test::process_alive;
using test::read_pids;
using test::run_captured;
using test::worker;

LaunchOptions options(int nproc, std::vector<std::string> steps) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.command = worker(std::move(steps));
  o.kill_grace = std::chrono::milliseconds(2000);
  return o;
}

// Splits "[r]: text" lines by rank; lines of the launcher itself go to rank -1.
std::map<int, std::vector<std::string>> by_rank(const std::string& text) {
  static const std::regex prefixed(R"(^\[(\d+)\]: (.*)$)");
  std::map<int, std::vector<std::string>> out;
  for (const auto& line : lines_of(text)) {
    std::smatch m;
    if (std::regex_match(line, m, prefixed)) {
      out[std::stoi(m[1])].push_back(m[2]);
    } else {
      out[-1].push_back(line);
    }
  }
  return out;
}

// Every worker of one launch gets the same fresh 256-bit token (64 hex
// digits); another launch gets another; a token in the launcher's
// environment is passed on instead. Written to files, never printed.
TEST(Launch, GivesEveryWorkerOfAJobItsOwnJobToken) {
  const auto dir = testing::temp_dir("launch-token");
  auto tokens = [&](const std::string& tag) {
    LaunchOptions o;
    o.nproc_per_node = 2;
    o.command = {"/bin/sh", "-c", "printf %s \"$PARATRAIN_JOB_TOKEN\" > " + dir + "/" + tag + ".$RANK"};
    const auto c = run_captured(o, dir);
    EXPECT_EQ(c.report.exit_code, 0) << c.err;
    return std::make_pair(test::slurp(dir + "/" + tag + ".0"), test::slurp(dir + "/" + tag + ".1"));
  };
  std::pair<std::string, std::string> first, second;
  {
    test::ScopedEnv none("PARATRAIN_JOB_TOKEN", std::nullopt);
    first = tokens("first");
    second = tokens("second");
  }
  EXPECT_EQ(first.first.size(), 64u);
  EXPECT_EQ(first.first, first.second);
  EXPECT_NE(first.first, second.first);
  test::ScopedEnv given("PARATRAIN_JOB_TOKEN", std::string("chosen-by-the-user"));
  const auto third = tokens("third");
  EXPECT_EQ(third.first, "chosen-by-the-user");
  EXPECT_EQ(third.second, "chosen-by-the-user");
}

// --plain-store (for PyTorch workers, whose TCPStore clients cannot pass our
// handshake): no token reaches the workers, even one in the environment, and
// they are told the agent store is c10d's TCPStore. (bench/run_ddp.sh runs
// PyTorch's DDP this way: its ranks meet in that store.)
TEST(Launch, PlainStoreGivesNoTokenAndATcpAgentStore) {
  const auto dir = testing::temp_dir("launch-plain-store");
  test::ScopedEnv given("PARATRAIN_JOB_TOKEN", std::string("not-for-plain-stores"));
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.plain_store = true;
  o.command = {"/bin/sh", "-c",
               "printf '%s|%s' \"$PARATRAIN_JOB_TOKEN\" \"$PARATRAIN_AGENT_STORE\" > " + dir + "/env.$RANK"};
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 0) << c.err;
  EXPECT_EQ(test::slurp(dir + "/env.0"), "|tcp");
  EXPECT_EQ(test::slurp(dir + "/env.1"), "|tcp");
}

TEST(Launch, AllRanksSucceedAndEveryLineIsPrefixedAndComplete) {
  const auto dir = testing::temp_dir("launch-ok");
  // 3000 lines per stream and rank overflow a 64 KiB pipe several times, so
  // lines reach the launcher split across reads.
  const int n = 3000;
  const auto c = run_captured(options(3, {"print", std::to_string(n), "partial", "no newline"}), dir);
  EXPECT_EQ(c.report.exit_code, 0) << c.err;
  EXPECT_EQ(c.report.first_failed, -1);
  ASSERT_EQ(c.report.workers.size(), 3u);
  for (const auto& w : c.report.workers) EXPECT_TRUE(w.ok() && !w.stopped_by_launcher);

  auto out = by_rank(c.out);
  auto err = by_rank(c.err);
  EXPECT_EQ(out.count(-1), 0u) << "unprefixed stdout line: " << out[-1].front();
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> want_out, want_err;
    for (int i = 0; i < n; ++i) {
      want_out.push_back("out " + std::to_string(r) + " " + std::to_string(i));
      want_err.push_back("err " + std::to_string(r) + " " + std::to_string(i));
    }
    want_out.push_back("no newline");  // the partial last line, flushed at exit
    EXPECT_EQ(out[r], want_out) << "rank " << r;
    EXPECT_EQ(err[r], want_err) << "rank " << r;
  }
  ASSERT_FALSE(err[-1].empty());
  EXPECT_EQ(err[-1].back(), "paratrain launch: all 3 ranks succeeded (ranks 0-2)");
}

TEST(Launch, WithoutPrefixWorkersWriteStraightThrough) {
  const auto dir = testing::temp_dir("launch-noprefix");
  auto o = options(1, {"print", "2"});
  o.prefix_output = false;
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 0);
  EXPECT_EQ(c.out, "out 0 0\nout 0 1\n");
}

// Parses the "env" step's KEY=VALUE lines of each rank.
std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> env;
  for (const auto& [rank, lines] : by_rank(out)) {
    for (const auto& line : lines) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) env[rank][line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return env;
}

TEST(Launch, EachRankSeesTorchrunsEnvironment) {
  const auto dir = testing::temp_dir("launch-env");
  test::ScopedEnv omp("OMP_NUM_THREADS", std::nullopt);  // unset: the launcher sets 1
  test::ScopedEnv blas("OPENBLAS_NUM_THREADS", "7");     // set: the launcher keeps it
  test::ScopedEnv rank("RANK", "55");                    // a stale value must not leak in
  auto o = options(2, {"env"});
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 29555;
  const auto c = run_captured(o, dir);
  ASSERT_EQ(c.report.exit_code, 0) << c.err;
  auto env = env_by_rank(c.out);
  for (int local = 0; local < 2; ++local) {
    const int r = 2 + local;
    const std::map<std::string, std::string> want = {
        {"RANK", std::to_string(r)}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"NODE_RANK", "1"},
        {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29555"}, {"OMP_NUM_THREADS", "1"},
        {"OPENBLAS_NUM_THREADS", "7"}, {"TORCHELASTIC_RESTART_COUNT", "0"}, {"TORCHELASTIC_MAX_RESTARTS", "0"},
        {"TORCHELASTIC_RUN_ID", "none"}};
    EXPECT_EQ(env[r], want) << "rank " << r;
  }
}

TEST(Launch, PicksAFreePortAndLoopbackOnOneNode) {
  const auto dir = testing::temp_dir("launch-port");
  test::ScopedEnv omp("OMP_NUM_THREADS", std::nullopt);
  const auto c = run_captured(options(1, {"env"}), dir);
  ASSERT_EQ(c.report.exit_code, 0) << c.err;
  EXPECT_GT(c.report.master_port, 0);
  auto env = env_by_rank(c.out);
  EXPECT_EQ(env[0]["MASTER_PORT"], std::to_string(c.report.master_port));
  EXPECT_EQ(env[0]["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env[0]["WORLD_SIZE"], "1");
  EXPECT_EQ(env[0]["OMP_NUM_THREADS"], "<unset>");  // one process per node: not limited
}

TEST(Launch, AFailingRankStopsTheOthersAndNamesItsExitCode) {
  const auto dir = testing::temp_dir("launch-fail");
  // Rank 1 fails once rank 0 is surely running (both wrote their pid); rank 0
  // would sleep a minute.
  const std::string pids = dir + "/pids";
  auto o = options(2, {"pidfile", pids, "on-rank", "1", "wait-lines", pids, "2", "fail-rank", "1", "3",
                       "sleep", "60"});
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 3) << c.err;
  EXPECT_LT(c.seconds, 30.0);  // vs the 60 s sleep it would otherwise finish: loose, the machine may be loaded
  EXPECT_EQ(c.report.first_failed, 1);
  const auto& failed = c.report.workers[1];
  EXPECT_TRUE(failed.exited);
  EXPECT_EQ(failed.exit_code, 3);
  EXPECT_FALSE(failed.stopped_by_launcher);
  const auto& stopped = c.report.workers[0];
  EXPECT_TRUE(stopped.stopped_by_launcher);
  EXPECT_FALSE(stopped.exited);
  EXPECT_EQ(stopped.signal, SIGTERM);
  const std::string named = "rank 1 (pid " + std::to_string(failed.pid) + ") exited with code 3";
  EXPECT_NE(c.err.find(named + "; stopping the other ranks"), std::string::npos) << c.err;
  EXPECT_NE(c.report.summary.find("FAILED with exit code 3: " + named + " first"), std::string::npos)
      << c.report.summary;
  EXPECT_NE(c.report.summary.find("rank 0 (pid " + std::to_string(stopped.pid) + ") was killed by SIGTERM"),
            std::string::npos)
      << c.report.summary;
  for (int pid : read_pids(pids)) EXPECT_FALSE(process_alive(pid)) << pid;
}

// A victim that blames a peer and exits first is not named as the cause:
// the rank that failed on its own is, with its exit code. Rank 1 ignores
// SIGTERM (as a rank already on its way out would) and is ready before rank 0
// prints the peer error and exits; rank 1 exits 3 only after that.
TEST(Launch, TheRankThatFailedOnItsOwnIsNamedNotThePeerThatSawItGo) {
  const auto dir = testing::temp_dir("launch-peer");
  const std::string ready = dir + "/ready";
  // Rank 0 ignores SIGTERM too: rank 1 may see both lines and exit before
  // rank 0 has run its exit, and the launcher's SIGTERM must not pre-empt
  // rank 0's own exit code (it did, rarely, on a loaded machine).
  auto o = options(2, {"on-rank", "0", "ignore-term", "on-rank", "1", "ignore-term", "on-rank", "1", "pidfile", ready,
                       "on-rank", "0", "wait-lines", ready, "1",
                       "on-rank", "0", "partial", "RuntimeError: Connection reset by peer\n",
                       "on-rank", "0", "pidfile", ready, "fail-rank", "0", "1",
                       "wait-lines", ready, "2", "exit", "3"});
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 3) << c.err;
  EXPECT_EQ(c.report.first_failed, 1) << c.report.summary;
  EXPECT_TRUE(c.report.workers[0].peer_error);
  EXPECT_EQ(c.report.workers[0].exit_code, 1);
  EXPECT_FALSE(c.report.workers[1].peer_error);
  const std::string named = "rank 1 (pid " + std::to_string(c.report.workers[1].pid) + ") exited with code 3 first";
  EXPECT_NE(c.report.summary.find("FAILED with exit code 3: " + named), std::string::npos) << c.report.summary;
  // ... with what its output says: a closed connection (not a timeout).
  EXPECT_NE(c.report.summary.find("exited with code 1 (its output says: the connection to a peer was closed"),
            std::string::npos)
      << c.report.summary;
}

// Two ranks fail on their own, the higher one first: it is named.
TEST(Launch, OfTwoRealFailuresTheEarlierIsNamed) {
  const auto dir = testing::temp_dir("launch-order");
  const std::string pids = dir + "/pids";
  auto o = options(2, {"on-rank", "0", "ignore-term", "pidfile", pids, "wait-lines", pids, "2",
                       "fail-rank", "1", "5", "sleep", "0.3", "exit", "7"});
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 5) << c.err;
  EXPECT_EQ(c.report.first_failed, 1) << c.report.summary;
  EXPECT_EQ(c.report.workers[0].exit_code, 7);
  EXPECT_LT(c.report.workers[1].ended_at, c.report.workers[0].ended_at);
}

TEST(Launch, ARankKilledByASignalIsNamedAndGives128PlusSignal) {
  const auto dir = testing::temp_dir("launch-sig");
  const auto c = run_captured(options(2, {"on-rank", "1", "kill-self", "9", "sleep", "60"}), dir);
  EXPECT_EQ(c.report.exit_code, 128 + SIGKILL) << c.err;
  EXPECT_LT(c.seconds, 30.0);  // vs the 60 s sleep it would otherwise finish: loose, the machine may be loaded
  EXPECT_EQ(c.report.first_failed, 1);
  EXPECT_EQ(c.report.workers[1].signal, SIGKILL);
  EXPECT_NE(c.report.summary.find("rank 1 (pid " + std::to_string(c.report.workers[1].pid) +
                                  ") was killed by SIGKILL first"),
            std::string::npos)
      << c.report.summary;
}

// --keep-going (for `paratrain federated`): a client rank dying is reported
// and the others finish; the launch succeeds. Rank 0 dying still stops all.
// The control without it is ARankKilledByASignalIsNamedAndGives128PlusSignal.
TEST(Launch, KeepGoingLetsTheOthersFinishWhenARankOtherThanZeroDies) {
  const auto dir = testing::temp_dir("launch-keep");
  auto o = options(3, {"on-rank", "2", "kill-self", "9", "sleep", "1"});
  o.keep_going = true;
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 0) << c.err;
  EXPECT_EQ(c.report.first_failed, -1);
  EXPECT_TRUE(c.report.workers[2].tolerated);
  EXPECT_EQ(c.report.workers[2].signal, SIGKILL);
  for (int r : {0, 1}) {
    EXPECT_TRUE(c.report.workers[r].ok()) << r;
    EXPECT_FALSE(c.report.workers[r].stopped_by_launcher) << r;
  }
  EXPECT_NE(c.err.find("--keep-going: the other ranks go on"), std::string::npos) << c.err;
  EXPECT_NE(c.report.summary.find("lost on the way: rank 2 (pid " + std::to_string(c.report.workers[2].pid) +
                                  ") was killed by SIGKILL"),
            std::string::npos)
      << c.report.summary;

  auto zero = options(2, {"on-rank", "0", "kill-self", "9", "sleep", "60"});
  zero.keep_going = true;
  const auto z = run_captured(zero, dir);
  EXPECT_EQ(z.report.exit_code, 128 + SIGKILL) << z.err;
  EXPECT_EQ(z.report.first_failed, 0);
  EXPECT_TRUE(z.report.workers[1].stopped_by_launcher);
}

TEST(Launch, ARankThatIgnoresSigtermIsKilledAfterTheGracePeriod) {
  const auto dir = testing::temp_dir("launch-ignore");
  const std::string pids = dir + "/pids";
  auto o = options(2, {"ignore-term", "pidfile", pids, "on-rank", "1", "wait-lines", pids, "2",
                       "fail-rank", "1", "2", "sleep", "60"});
  o.kill_grace = std::chrono::milliseconds(300);
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 2) << c.err;
  EXPECT_LT(c.seconds, 30.0);  // vs the 60 s sleep it would otherwise finish: loose, the machine may be loaded
  EXPECT_TRUE(c.report.workers[0].stopped_by_launcher);
  EXPECT_EQ(c.report.workers[0].signal, SIGKILL);  // SIGTERM was ignored
}

TEST(Launch, NoProcessOutlivesAFailedLaunchGrandchildrenIncluded) {
  const auto dir = testing::temp_dir("launch-grandchild");
  const std::string pids = dir + "/pids";
  // Each rank writes its pid and starts a grandchild that ignores SIGTERM;
  // once all four pids are written rank 1 fails.
  auto o = options(2, {"pidfile", pids, "grandchild", pids, "on-rank", "1", "wait-lines", pids, "4",
                       "fail-rank", "1", "5", "sleep", "60"});
  o.kill_grace = std::chrono::milliseconds(300);
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 5) << c.err;
  EXPECT_LT(c.seconds, 30.0);  // vs the 60 s sleep it would otherwise finish: loose, the machine may be loaded
  const auto all = read_pids(pids);
  ASSERT_EQ(all.size(), 4u);
  for (int pid : all) EXPECT_FALSE(process_alive(pid)) << "pid " << pid << " outlived the launch";
}

TEST(Launch, LeftoverGrandchildrenOfSuccessfulRanksAreStoppedToo) {
  const auto dir = testing::temp_dir("launch-leftover");
  const std::string pids = dir + "/pids";
  auto o = options(2, {"grandchild", pids, "print", "1"});
  o.kill_grace = std::chrono::milliseconds(300);
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 0) << c.err;
  EXPECT_LT(c.seconds, 30.0);  // vs the 60 s sleep it would otherwise finish: loose, the machine may be loaded
  const auto all = read_pids(pids);
  ASSERT_EQ(all.size(), 2u);
  for (int pid : all) EXPECT_FALSE(process_alive(pid)) << "pid " << pid << " outlived the launch";
}

TEST(Launch, SigtermToTheLauncherIsForwardedAndEndsItPromptly) {
  const auto dir = testing::temp_dir("launch-forward");
  const std::string pids = dir + "/pids";
  auto o = options(2, {"pidfile", pids, "sleep", "60"});
  // Signal this (the launcher's) process once both workers run.
  std::thread signaller([&] {
    if (test::wait_for_lines(pids, 2)) kill(getpid(), SIGTERM);
  });
  const auto c = run_captured(o, dir);
  signaller.join();
  EXPECT_EQ(c.report.exit_code, 128 + SIGTERM) << c.err;
  EXPECT_LT(c.seconds, 30.0);  // vs the 60 s sleep it would otherwise finish: loose, the machine may be loaded
  EXPECT_EQ(c.report.received_signal, SIGTERM);
  for (const auto& w : c.report.workers) {
    EXPECT_TRUE(w.stopped_by_launcher);
    EXPECT_EQ(w.signal, SIGTERM);  // forwarded, not escalated
  }
  EXPECT_NE(c.err.find("got SIGTERM; forwarding it to the workers"), std::string::npos) << c.err;
  EXPECT_NE(c.report.summary.find("interrupted by SIGTERM"), std::string::npos);
  for (int pid : read_pids(pids)) EXPECT_FALSE(process_alive(pid)) << pid;
  // The launcher put the previous disposition back.
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

TEST(Launch, AProgramThatCannotRunIsAClearErrorAndStartsNothing) {
  const auto dir = testing::temp_dir("launch-badprog");
  auto o = options(2, {});
  o.command = {"no-such-program-xyz", "arg"};
  try {
    run_captured(o, dir);
    FAIL() << "accepted a missing program";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot launch 'no-such-program-xyz'"), std::string::npos) << e.what();
  }
  // Executable but not a program the kernel can run: the exec error, with a hint.
  const std::string script = dir + "/script";
  std::ofstream(script) << "echo hi\n";
  chmod(script.c_str(), 0755);
  o.command = {script};
  try {
    run_captured(o, dir);
    FAIL() << "accepted a file without #!";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0: launcher: cannot execute '" + script + "': Exec format error"),
              std::string::npos) << what;
    EXPECT_NE(what.find("#!"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace paratrain::launch

// How the shm backend fails and cleans up: no segment left in /dev/shm after
// a run or after a rank's death; a rank that dies (SIGKILL), stops
// (SIGSTOP), leaves or aborts mid-collective makes the others fail with an
// error naming it, instead of hanging.
//
// The process tests run this binary again as two child ranks
// (ShmChild.Rank, skipped unless PARATRAIN_SHM_CHILD is set) that meet in a
// c10d::FileStore; real processes, so death is a real pid going away.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/torch.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "paratrain/comm/shm/shm_group.h"
#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"

extern char** environ;

namespace {

using paratrain::comm::ProcessGroup;
using paratrain::testing::run_ranks_on;

std::vector<std::string> job_segments(const std::string& job) {
  std::vector<std::string> found;
  const std::string prefix = paratrain::comm::shm_segment_prefix(job);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path().string());
  return found;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// One rank of a process test. Scenarios:
//   clean: three all-reduces, exit normally.
//   die:   one all-reduce; rank 1 then SIGKILLs itself, rank 0's next
//          all-reduce must fail naming rank 1 as dead.
//   stop:  one all-reduce; rank 1 then SIGSTOPs itself, rank 0's next
//          all-reduce must time out (group timeout 2 s) naming rank 1.
TEST(ShmChild, Rank) {
  const std::string scenario = env_or("PARATRAIN_SHM_CHILD", "");
  if (scenario.empty()) GTEST_SKIP() << "only run as a child of the ShmProcesses tests";
  const int rank = std::atoi(env_or("RANK", "0").c_str());
  auto store = c10::make_intrusive<c10d::FileStore>(env_or("PARATRAIN_SHM_STORE", ""), 2);
  paratrain::comm::ShmOptions options;
  options.job = env_or("PARATRAIN_SHM_JOB", "");
  options.timeout = scenario == "stop" ? std::chrono::seconds(2) : std::chrono::seconds(60);
  auto group = paratrain::comm::make_shm_group(store, rank, 2, options);
  auto t = torch::ones({1000});
  group->all_reduce(t)->wait();
  ASSERT_TRUE(torch::equal(t, torch::full({1000}, 2.0f)));
  if (scenario == "clean") {
    for (int i = 0; i < 2; ++i) group->all_reduce(t)->wait();
    return;
  }
  if (rank == 1) raise(scenario == "die" ? SIGKILL : SIGSTOP);
  try {
    group->all_reduce(t)->wait(std::chrono::seconds(120));
    ADD_FAILURE() << "the all-reduce with a " << scenario << " peer succeeded";
  } catch (const paratrain::CommError& e) {
    const std::string what = e.what();
    std::printf("rank 0 error: %s\n", what.c_str());
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    if (scenario == "die") {
      EXPECT_NE(what.find("died"), std::string::npos) << what;
    } else {
      EXPECT_NE(dynamic_cast<const paratrain::TimeoutError*>(&e), nullptr) << what;
      EXPECT_NE(what.find("stopped"), std::string::npos) << what;
    }
  }
}

struct Child {
  pid_t pid = -1;
  std::string log;
};

Child spawn_rank(const std::string& scenario, int rank, const std::string& dir, const std::string& job) {
  Child c;
  c.log = dir + "/rank" + std::to_string(rank) + ".log";
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) env_storage.emplace_back(*e);
  env_storage.push_back("PARATRAIN_SHM_CHILD=" + scenario);
  env_storage.push_back("RANK=" + std::to_string(rank));
  env_storage.push_back("PARATRAIN_SHM_STORE=" + dir + "/store");
  env_storage.push_back("PARATRAIN_SHM_JOB=" + job);
  std::vector<char*> envp;
  for (auto& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=ShmChild.Rank";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int rc = posix_spawn(&c.pid, exe.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn of the child rank failed");
  return c;
}

int wait_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the two ranks of `scenario`; returns rank 0's and rank 1's wait
// statuses. Rank 0 always ends on its own (its group timeout bounds it); a
// stopped rank 1 is killed once rank 0 is done.
std::pair<int, int> run_scenario(const std::string& scenario, const std::string& job, std::string* log0) {
  const std::string dir = paratrain::testing::temp_dir("shm-" + scenario);
  Child r0 = spawn_rank(scenario, 0, dir, job);
  Child r1 = spawn_rank(scenario, 1, dir, job);
  const int s0 = wait_status(r0.pid);
  if (scenario == "stop") kill(r1.pid, SIGKILL);
  const int s1 = wait_status(r1.pid);
  *log0 = read_all(r0.log);
  return {s0, s1};
}

TEST(ShmProcesses, ACleanRunLeavesNoSegment) {
  const std::string job = "clean-" + std::to_string(getpid());
  std::string log0;
  const auto [s0, s1] = run_scenario("clean", job, &log0);
  EXPECT_TRUE(WIFEXITED(s0) && WEXITSTATUS(s0) == 0) << log0;
  EXPECT_TRUE(WIFEXITED(s1) && WEXITSTATUS(s1) == 0);
  EXPECT_TRUE(job_segments(job).empty());
}

TEST(ShmProcesses, ADeadRankFailsThePeerAndLeavesNoSegment) {
  const std::string job = "die-" + std::to_string(getpid());
  std::string log0;
  const auto [s0, s1] = run_scenario("die", job, &log0);
  EXPECT_TRUE(WIFSIGNALED(s1) && WTERMSIG(s1) == SIGKILL) << "rank 1 should have killed itself";
  EXPECT_TRUE(WIFEXITED(s0) && WEXITSTATUS(s0) == 0) << log0;
  EXPECT_NE(log0.find("died"), std::string::npos) << log0;
  EXPECT_TRUE(job_segments(job).empty());
}

TEST(ShmProcesses, AStoppedRankIsATimeoutNamingIt) {
  const std::string job = "stop-" + std::to_string(getpid());
  std::string log0;
  const auto [s0, s1] = run_scenario("stop", job, &log0);
  EXPECT_TRUE(WIFEXITED(s0) && WEXITSTATUS(s0) == 0) << log0;
  EXPECT_NE(log0.find("stopped"), std::string::npos) << log0;
  EXPECT_TRUE(job_segments(job).empty());
}

TEST(ShmThreads, NoSegmentIsVisibleOnceTheGroupIsBuilt) {
  const std::string job = "test-" + std::to_string(getpid());  // run_ranks_on's job name
  run_ranks_on("shm", 2, [&](ProcessGroup& pg) {
    EXPECT_EQ(pg.backend(), "shm");
    EXPECT_TRUE(job_segments(job).empty()) << "rank 0 unlinks once every rank mapped the segment";
    auto t = torch::ones({3});
    pg.all_reduce(t)->wait();
  });
  EXPECT_TRUE(job_segments(job).empty());
}

TEST(ShmThreads, APeerThatLeftFailsTheOthersNamingIt) {
  run_ranks_on("shm", 2, [](ProcessGroup& pg) {
    if (pg.rank() == 1) return;  // destroys its group: gone for good
    auto t = torch::ones({8});
    try {
      pg.all_reduce(t)->wait();
      ADD_FAILURE() << "an all-reduce without rank 1 succeeded";
    } catch (const paratrain::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("left"), std::string::npos) << e.what();
    }
    // The group is unusable after a failure: later operations say so.
    EXPECT_THROW(pg.all_reduce(t)->wait(), paratrain::CommError);
  });
}

TEST(ShmThreads, AbortFailsAWaiterAndLaterOperations) {
  std::atomic<bool> done{false};
  run_ranks_on("shm", 2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    auto t = torch::ones({8});
    auto work = pg.all_reduce(t);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      pg.abort();
    });
    try {
      work->wait();
      ADD_FAILURE() << "an aborted all-reduce succeeded";
    } catch (const paratrain::CommError& e) {
      EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
    }
    aborter.join();
    EXPECT_THROW(pg.all_reduce(t), paratrain::CommError);
    done = true;
  });
}

}  // namespace

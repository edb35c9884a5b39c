// Two Slurm jobs packed onto one node, as srun starts their tasks (SLURM_*
// variables, no MASTER_PORT): each takes its own store port from its job id
// (Note [A store port per Slurm job] in comm/world_env.cpp) and both finish.
// Before, both served on 29500 and the second job failed.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/multi_rank.h"
#include "tests/support/spawn.h"

namespace {

using paratrain::testing::read_file;

// A job of 128 steps at 2 ranks (a second or two), writing under `dir`.
std::string write_job(const std::string& dir) {
  const auto config = dir + "/job.toml";
  std::ofstream(config) << "[run]\noutput_dir = \"" << dir << "/runs\"\nlog_every = 0\n"
                        << "[model]\nhidden = [16]\n"
                        << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 2048\n"
                        << "synthetic_test_size = 64\nsynthetic_image_size = 8\nbatch_size = 16\n"
                        << "[train]\nepochs = 2\n[world]\ntimeout_s = 30\n";
  return config;
}

TEST(SlurmJobs, TwoJobsOnOneNodeWithoutMasterPortBothFinish) {
  const auto dir = paratrain::testing::temp_dir("slurm-jobs");
  const auto config = write_job(dir);
  struct Task {
    pid_t pid;
    std::string log;
  };
  std::vector<Task> tasks;
  for (const std::string job : {"4101", "4102"}) {
    for (const std::string rank : {"0", "1"}) {
      const std::string log = dir + "/job" + job + "_rank" + rank + ".log";
      const pid_t pid = paratrain::testing::spawn_logged(
          {PARATRAIN_CLI, "train", "--config", config, "--set", "run.name=job" + job},
          log,
          {"SLURM_JOB_ID=" + job, "SLURM_PROCID=" + rank, "SLURM_LOCALID=" + rank, "SLURM_NTASKS=2",
           "SLURM_NTASKS_PER_NODE=2", "SLURM_JOB_NODELIST=localhost"});
      ASSERT_GT(pid, 0);
      tasks.push_back({pid, log});
    }
  }
  for (const auto& t : tasks) {
    const auto status = paratrain::testing::wait_exit(t.pid, std::chrono::seconds(120));
    ASSERT_TRUE(status) << read_file(t.log);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << read_file(t.log);
  }
  EXPECT_NE(read_file(tasks[0].log).find("done:"), std::string::npos) << read_file(tasks[0].log);
  EXPECT_NE(read_file(tasks[2].log).find("done:"), std::string::npos) << read_file(tasks[2].log);
}

// Two jobs given the same MASTER_PORT: a rank of the second that reaches the
// first job's store is refused by name (Note [Whose store is this] in
// comm/store_connect.cpp), and the first job is unharmed.
TEST(SlurmJobs, ARankThatReachesAnotherJobsStoreIsRefusedByName) {
  const auto dir = paratrain::testing::temp_dir("slurm-stray");
  const auto config = write_job(dir);
  // Below Linux's ephemeral ports (32768 and up), which a connection may hold.
  const std::string port = "MASTER_PORT=" + std::to_string(20000 + ::getpid() % 10000);
  auto start = [&](const std::string& job, const std::string& rank) {
    const std::string log = dir + "/job" + job + "_rank" + rank + ".log";
    const pid_t pid = paratrain::testing::spawn_logged(
        {PARATRAIN_CLI, "train", "--config", config, "--set", "run.name=job" + job}, log,
        {port, "SLURM_JOB_ID=" + job, "SLURM_PROCID=" + rank, "SLURM_LOCALID=" + rank, "SLURM_NTASKS=2",
         "SLURM_NTASKS_PER_NODE=2", "SLURM_JOB_NODELIST=localhost"});
    return std::make_pair(pid, log);
  };
  const auto first0 = start("5101", "0");
  const auto stray = start("5102", "1");
  const auto stray_exit = paratrain::testing::wait_exit(stray.first, std::chrono::seconds(60));
  const auto first1 = start("5101", "1");
  ASSERT_TRUE(stray_exit) << read_file(stray.second);
  EXPECT_TRUE(WIFEXITED(*stray_exit) && WEXITSTATUS(*stray_exit) != 0) << read_file(stray.second);
  EXPECT_NE(read_file(stray.second).find("rank 1 of job 'slurm-5102' reached the TCPStore"), std::string::npos)
      << read_file(stray.second);
  EXPECT_NE(read_file(stray.second).find("which is job 'slurm-5101''s"), std::string::npos) << read_file(stray.second);
  for (const auto& [pid, log] : {first0, first1}) {
    const auto status = paratrain::testing::wait_exit(pid, std::chrono::seconds(120));
    ASSERT_TRUE(status) << read_file(log);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << read_file(log);
  }
}

}  // namespace

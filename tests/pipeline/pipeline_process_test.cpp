// Pipeline stages as real processes under `paratrain launch`: a stage killed
// in the middle of a schedule (its neighbour blocked in a receive from it)
// makes the job fail fast, naming the rank, instead of hanging until the
// collective timeout. The one real-process pipeline test: everything else
// runs ranks as threads.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/multi_rank.h"

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The pid of the process whose command line mentions `marker` and whose
// environment has RANK=<rank>; -1 if none (yet).
pid_t find_rank(const std::string& marker, int rank) {
  const std::string want = "RANK=" + std::to_string(rank);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (read_file(entry.path() / "cmdline").find(marker) == std::string::npos) continue;
    std::string env = read_file(entry.path() / "environ");
    std::stringstream vars(env);
    std::string var;
    while (std::getline(vars, var, '\0')) {
      if (var == want) return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

TEST(PipelineProcesses, AStageKilledMidScheduleFailsTheJobFastNamingIt) {
  const auto dir = paratrain::testing::temp_dir("pp-kill");
  const auto config = dir + "/job.toml";
  // Long enough that it is still training when killed; the timeout (120 s)
  // is far above what failing fast takes.
  std::ofstream(config) << "[run]\nname = \"job\"\noutput_dir = \"" << dir << "/runs\"\nlog_every = 0\n"
                        << "[model]\nhidden = [32, 32, 32]\n"
                        << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 4096\n"
                        << "synthetic_test_size = 64\nsynthetic_image_size = 8\nbatch_size = 32\n"
                        << "[train]\nepochs = 1000\neval_every_epochs = 0\n[world]\ntimeout_s = 120\n"
                        << "[parallel]\npp = 2\n[pipeline]\nschedule = \"1f1b\"\nmicrobatches = 4\n"
                        << "trace_steps = 1000000\n";
  paratrain::testing::ProcessResult result;
  std::thread launcher([&] {
    result = paratrain::testing::run_cli(
        {"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", config},
        std::chrono::seconds(240));
  });
  // The stage's timeline file appears with its first micro-batch: from then
  // on it is inside the schedule.
  const fs::path trace = fs::path(dir) / "runs" / "job" / "version_0" / "trace" / "rank_1.jsonl";
  pid_t victim = -1;
  for (int i = 0; i < 2400 && victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (fs::exists(trace) && fs::file_size(trace) > 200) victim = find_rank(config, 1);
  }
  ASSERT_GT(victim, 0) << "rank 1 never started its schedule";
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  launcher.join();
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.exit_code, -1) << "the launcher had to be killed: the job hung\n" << result.output;
  EXPECT_NE(result.output.find("rank 1 (pid " + std::to_string(victim) + ") was killed by SIGKILL"), std::string::npos)
      << result.output;
}

}  // namespace

// In-job recovery of rank 0 under the real launcher: `paratrain launch
// --keep-going --keep-going-rank0` with `paratrain train --set
// elastic.in_job=true` on 3 processes, rank 0 SIGKILLed after step 3
// (PARATRAIN_FAULT_KILL). Real processes on purpose, and one test only:
// what is tested is the launcher's store outliving rank 0 and the survivors
// electing a new rank 0 that finishes the run and writes its record. The
// arithmetic of the recovery is tested with thread ranks in tests/elastic/.
// Without --keep-going-rank0 rank 0's death stops the job
// (Launch.KeepGoingLetsTheOthersFinishWhenARankOtherThanZeroDies).
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launch_test_util.h"
#include "paratrain/launch/launcher.h"
#include "tests/support/multi_rank.h"

namespace paratrain::launch {
namespace {

namespace fs = std::filesystem;
using test::run_captured;
using test::ScopedEnv;

// 168 synthetic 8x8 images, 8 per rank: 7 steps of 24 on 3 ranks, of
// which 3 before the kill; the survivors split the other 96 (6 steps of 16).
std::string write_config(const std::string& dir) {
  return test::write_small_mlp_config(dir, "in_job.toml", "in_job", 168, 8, R"([train]
epochs = 1
[elastic]
in_job = true
[world]
timeout_s = 60
)");
}

TEST(InJobLaunch, RankZeroKilledWithKeepGoingRank0TheSurvivorsElectANewRankZeroThatFinishesTheRun) {
  const std::string dir = testing::temp_dir("in_job_launch");
  const std::string config = write_config(dir);
  ScopedEnv kill("PARATRAIN_FAULT_KILL", "0:3");
  LaunchOptions o;
  o.nproc_per_node = 3;
  o.keep_going = true;
  o.keep_going_rank0 = true;
  o.kill_grace = std::chrono::milliseconds(2000);
  o.command = {PARATRAIN_CLI, "train", "-c", config, "--set", "run.output_dir=" + dir + "/runs"};
  const auto c = run_captured(o, dir);
  const std::string log = c.out + c.err;
  ASSERT_EQ(c.report.exit_code, 0) << log;
  ASSERT_EQ(c.report.workers.size(), 3u) << log;
  EXPECT_TRUE(c.report.workers[0].tolerated) << log;
  EXPECT_EQ(c.report.workers[0].signal, SIGKILL) << log;
  for (int r : {1, 2}) EXPECT_TRUE(c.report.workers[r].ok()) << "rank " << r << "\n" << log;

  // The new rank 0 (old rank 1) wrote the recovery record and the end of
  // the run into the same run folder.
  const fs::path run = fs::path(dir) / "runs" / "in_job" / "version_0";
  std::vector<nlohmann::json> recoveries;
  int64_t last_step = 0;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "recovery") recoveries.push_back(j);
    if (j.value("kind", "") == "train") last_step = j["step"].get<int64_t>();
  }
  ASSERT_EQ(recoveries.size(), 1u) << log;
  EXPECT_EQ(recoveries[0]["dead_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(recoveries[0]["survivors"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(recoveries[0]["world_size"], 2);
  EXPECT_EQ(recoveries[0]["first_position"], 3 * 24);
  EXPECT_EQ(last_step, 3 + 6) << log;
  std::ifstream status_file(run / "run.json");
  const auto status = nlohmann::json::parse(status_file);
  EXPECT_EQ(status["status"], "finished") << status.dump();
}

}  // namespace
}  // namespace paratrain::launch

// In-job recovery of rank 0 under the real launcher: `paratrain launch
// --keep-going --keep-going-rank0` with `paratrain train --set
// elastic.in_job=true` on 3 processes, rank 0 SIGKILLed after step 3
// (PARATRAIN_FAULT_KILL). Real processes on purpose: what is tested is the
// launcher's store outliving rank 0 and the survivors electing a new rank 0
// that finishes the run and writes its record; and a rank that dies at
// start-up, before the world is built, which the others start without. The
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

// 3 workers of `paratrain train` on that config under --keep-going (and
// --keep-going-rank0), one of them killed as PARATRAIN_FAULT_KILL = `kill`
// says; the launch must succeed with `dead` killed and the others done.
struct InJobRun {
  test::Captured launch;
  std::string log;
  std::vector<nlohmann::json> recoveries;  // metrics.jsonl's "recovery" records
  int64_t last_step = 0;                    // of its "train" records
  nlohmann::json status;                    // run.json
};
InJobRun run_in_job(const std::string& dir, const std::string& kill, int dead, bool keep_going_rank0) {
  const std::string config = write_config(dir);
  ScopedEnv fault("PARATRAIN_FAULT_KILL", kill);
  LaunchOptions o;
  o.nproc_per_node = 3;
  o.keep_going = true;
  o.keep_going_rank0 = keep_going_rank0;
  o.kill_grace = std::chrono::milliseconds(2000);
  o.command = {PARATRAIN_CLI, "train", "-c", config, "--set", "run.output_dir=" + dir + "/runs"};
  InJobRun r{run_captured(o, dir)};
  r.log = r.launch.out + r.launch.err;
  EXPECT_EQ(r.launch.report.exit_code, 0) << r.log;
  EXPECT_EQ(r.launch.report.workers.size(), 3u) << r.log;
  if (r.launch.report.workers.size() != 3u) return r;
  for (int w = 0; w < 3; ++w) {
    const auto& worker = r.launch.report.workers[static_cast<std::size_t>(w)];
    if (w == dead) {
      EXPECT_TRUE(worker.tolerated) << r.log;
      EXPECT_EQ(worker.signal, SIGKILL) << r.log;
    } else {
      EXPECT_TRUE(worker.ok()) << "rank " << w << "\n" << r.log;
    }
  }
  const fs::path run = fs::path(dir) / "runs" / "in_job" / "version_0";
  std::ifstream in(run / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "recovery") r.recoveries.push_back(j);
    if (j.value("kind", "") == "train") r.last_step = j["step"].get<int64_t>();
  }
  std::ifstream status_file(run / "run.json");
  r.status = nlohmann::json::parse(status_file, nullptr, /*allow_exceptions=*/false);
  return r;
}

TEST(InJobLaunch, RankZeroKilledWithKeepGoingRank0TheSurvivorsElectANewRankZeroThatFinishesTheRun) {
  const auto r = run_in_job(testing::temp_dir("in_job_launch"), "0:3", 0, /*keep_going_rank0=*/true);
  // The new rank 0 (old rank 1) wrote the recovery record and the end of
  // the run into the same run folder.
  ASSERT_EQ(r.recoveries.size(), 1u) << r.log;
  EXPECT_EQ(r.recoveries[0]["dead_ranks"], nlohmann::json::array({0}));
  EXPECT_EQ(r.recoveries[0]["survivors"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(r.recoveries[0]["world_size"], 2);
  EXPECT_EQ(r.recoveries[0]["first_position"], 3 * 24);
  EXPECT_EQ(r.last_step, 3 + 6) << r.log;
  EXPECT_EQ(r.status.value("status", ""), "finished") << r.status.dump();
}

// Rank 1 dies after its check-in, before it published its Gloo address
// (PARATRAIN_FAULT_KILL=1:0): the others, connecting to it, would wait
// world.timeout_s and fail. The launcher ends the rendezvous and, under
// elastic.in_job, ranks 0 and 2 build the world between themselves and
// train the whole run at 2 ranks (Note [Shrinking at start-up] in
// comm/rendezvous.cpp). Without it they fail with "was ended".
TEST(InJobLaunch, ARankDeadBeforeTheWorldIsBuiltTheOthersStartWithoutIt) {
  const auto r = run_in_job(testing::temp_dir("in_job_start"), "1:0", 1, /*keep_going_rank0=*/false);
  EXPECT_NE(r.log.find("elastic.in_job: rank(s) 1 of 3 died before the world was built"), std::string::npos)
      << r.log;
  EXPECT_NE(r.log.find("survivors start without them as ranks 0-1 (old ranks 0,2)"), std::string::npos) << r.log;
  // The whole run at 2 ranks: 168 images in steps of 2 x 8, no recovery.
  EXPECT_TRUE(r.recoveries.empty()) << r.log;
  EXPECT_EQ(r.last_step, 168 / 16) << r.log;
  EXPECT_EQ(r.status.value("status", ""), "finished") << r.status.dump();
}

}  // namespace
}  // namespace paratrain::launch

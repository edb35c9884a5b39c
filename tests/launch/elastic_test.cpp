// Restart-based elasticity end to end: `paratrain train` under launch() with
// max_restarts, one rank SIGKILLed mid-run (PARATRAIN_FAULT_KILL), and the
// oracle the issue states: the job that recovered ends with the parameters of
// a clean run resumed from the same checkpoint. Real processes, on purpose:
// what is tested is a process dying and a new generation meeting again.
#include <sys/stat.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "paratrain/launch/launcher.h"
#include "launch_test_util.h"
#include "tests/support/multi_rank.h"

namespace paratrain::launch {
namespace {

namespace fs = std::filesystem;
using test::run_captured;
using test::ScopedEnv;

// 128 synthetic 8x8 images, batch 16 per rank on 2 ranks: 4 steps an epoch,
// 12 in all, a checkpoint every 2 steps, each a fraction of a second.
// timeout_s bounds how long a survivor could wait on a dead peer: Gloo sees
// the closed socket at once, so it is only a backstop against a hang.
std::string write_config(const std::string& dir) {
  return test::write_small_mlp_config(dir, "elastic.toml", "elastic", 128, 16, R"([train]
epochs = 3
checkpoint_every_steps = 2
[world]
timeout_s = 60
)");
}

LaunchOptions train_job(const std::string& config, const std::vector<std::string>& sets) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.kill_grace = std::chrono::milliseconds(2000);
  o.command = {PARATRAIN_CLI, "train", "-c", config};
  for (const auto& s : sets) {
    o.command.push_back("--set");
    o.command.push_back(s);
  }
  return o;
}

fs::path final_checkpoint(const std::string& output_dir) {
  return fs::path(output_dir) / "elastic" / "version_0" / "checkpoints" / "step_00000012";
}

TEST(ElasticLaunch, AKilledWorkerIsRestartedAndTheRunEndsAsTheSameCheckpointResumedCleanly) {
  const std::string dir = testing::temp_dir("elastic");
  const std::string config = write_config(dir);

  // Run A: rank 1 SIGKILLs itself after step 5; checkpoints 2 and 4 are
  // complete by then (rank 1 cannot pass step 5's all-reduce before rank 0
  // committed step 4), step 6's never starts. The launcher restarts both.
  test::Captured a;
  {
    ScopedEnv kill("PARATRAIN_FAULT_KILL", "1:5");
    LaunchOptions o = train_job(config, {"run.output_dir=" + dir + "/a"});
    o.max_restarts = 2;
    a = run_captured(o, dir);
  }
  const std::string a_log = a.out + a.err;
  ASSERT_EQ(a.report.exit_code, 0) << a_log;
  EXPECT_EQ(a.report.restarts, 1) << a_log;
  ASSERT_EQ(a.report.failures.size(), 1u) << a_log;
  EXPECT_EQ(a.report.failures[0].rank, 1);
  EXPECT_FALSE(a.report.failures[0].exited);
  EXPECT_EQ(a.report.failures[0].signal, SIGKILL);
  EXPECT_NE(a_log.find("generation 0 failed: rank 1 (pid " + std::to_string(a.report.failures[0].pid) +
                       ") was killed by SIGKILL; restart 1 of 2"),
            std::string::npos)
      << a_log;
  EXPECT_NE(a_log.find("all 2 ranks succeeded (ranks 0-1) (after 1 restart)"), std::string::npos) << a_log;

  // The restarted generation resumed from step 4, inside the same version.
  static const std::regex resumed(R"(resumed from (\S+) at epoch \d+, batch \d+, step (\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a_log, m, resumed)) << a_log;
  const std::string checkpoint = m[1];
  EXPECT_EQ(m[2], "4") << a_log;
  EXPECT_NE(a_log.find("restart 1: continuing " + dir + "/a/elastic/version_0 from its latest complete checkpoint"),
            std::string::npos)
      << a_log;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "a" / "elastic" / "version_1")) << "a restart must not start a new version";
  ASSERT_TRUE(fs::exists(final_checkpoint(dir + "/a"))) << a_log;

  // Run B: no failure, resumed from the same checkpoint by hand.
  const auto b = run_captured(train_job(config, {"run.output_dir=" + dir + "/b", "train.resume=" + checkpoint}), dir);
  ASSERT_EQ(b.report.exit_code, 0) << b.out << b.err;

  // Model, optimizer state and rng: the same as B's to float32 precision
  // (the same ranks, data order and reductions, so in practice bit-equal).
  const auto same = testing::run_cli({"checkpoint", "compare", final_checkpoint(dir + "/a").string(),
                                      final_checkpoint(dir + "/b").string(), "--all", "--rtol", "1e-5"});
  EXPECT_EQ(same.exit_code, 0) << same.output;
  // Negative control: the comparison does see a difference, here eight
  // steps of training.
  const auto differs = testing::run_cli(
      {"checkpoint", "compare", final_checkpoint(dir + "/a").string(), checkpoint, "--rtol", "1e-5"});
  EXPECT_NE(differs.exit_code, 0) << differs.output;
}

// elastic.keep_global_batch: generation 0 runs 2 ranks (global batch 32)
// and dies after step 5; the next generation runs as 1 process (a node
// lost), resumed through the restart path (TORCHELASTIC_RESTART_COUNT=1,
// the launch's id). With the option its per-rank batch doubles to 32 and it
// equals a 1-process run resumed by hand from the same checkpoint with batch
// 32; without it (the negative control) the batch stays 16 and it differs.
TEST(ElasticLaunch, KeepGlobalBatchDoublesThePerRankBatchWhenTheWorldHalves) {
  const std::string dir = testing::temp_dir("elastic_keep_batch");
  const std::string config = write_config(dir);
  auto first_generation = [&](const std::string& out, const std::string& id) {
    ScopedEnv kill("PARATRAIN_FAULT_KILL", "1:5");
    LaunchOptions o = train_job(config, {"run.output_dir=" + out});
    o.rdzv_id = id;
    const auto c = run_captured(o, dir);
    EXPECT_NE(c.report.exit_code, 0) << c.err;
    return c.out + c.err;
  };
  auto next_generation = [&](const std::string& out, const std::string& id, bool keep) {
    ScopedEnv restart("TORCHELASTIC_RESTART_COUNT", "1");
    ScopedEnv launch_id("PARATRAIN_LAUNCH_ID", id);
    return testing::run_cli({"train", "-c", config, "--set", "run.output_dir=" + out, "--set",
                             std::string("elastic.keep_global_batch=") + (keep ? "true" : "false")});
  };
  first_generation(dir + "/a", "keep-a");
  const auto a = next_generation(dir + "/a", "keep-a", true);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("elastic.keep_global_batch: world size 2 -> 1 (dp 2 -> 1): per-rank batch 16 -> 32 "
                          "(train.accumulate 1), global batch 32 kept"),
            std::string::npos)
      << a.output;
  static const std::regex resumed(R"(resumed from (\S+) at epoch \d+, batch \d+, step (\d+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(a.output, m, resumed)) << a.output;
  const std::string checkpoint = m[1];
  EXPECT_EQ(m[2], "4") << a.output;

  // The oracle: one process, batch 32, from the same checkpoint.
  const auto b = testing::run_cli({"train", "-c", config, "--set", "run.output_dir=" + dir + "/b", "--set",
                                   "data.batch_size=32", "--set", "train.resume=" + checkpoint});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto same = testing::run_cli({"checkpoint", "compare", final_checkpoint(dir + "/a").string(),
                                      final_checkpoint(dir + "/b").string(), "--all", "--rtol", "1e-5"});
  EXPECT_EQ(same.exit_code, 0) << same.output;

  // Negative control: without the option the per-rank batch stays 16, so the
  // global batch halves (twice the steps) and the model differs.
  first_generation(dir + "/c", "keep-c");
  const auto c = next_generation(dir + "/c", "keep-c", false);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(c.output.find("elastic.keep_global_batch:"), std::string::npos) << c.output;
  fs::path c_final;  // the newest checkpoint: more than 12 steps at the smaller global batch
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "c" / "elastic" / "version_0" / "checkpoints")) {
    if (e.path().filename().string().rfind("step_", 0) == 0 && e.path() > c_final) c_final = e.path();
  }
  ASSERT_GT(c_final.filename().string(), "step_00000012") << c.output;
  const auto differs = testing::run_cli({"checkpoint", "compare", c_final.string(),
                                         final_checkpoint(dir + "/b").string(), "--rtol", "1e-5"});
  EXPECT_NE(differs.exit_code, 0) << differs.output;
}

TEST(ElasticLaunch, WithoutRestartsLeftTheLaunchFailsWithTheWorkersCode) {
  const std::string dir = testing::temp_dir("elastic_fail");
  // Every generation's rank 0 exits 3: one restart, then the launch fails.
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.max_restarts = 1;
  o.command = test::worker({"env", "fail-rank", "0", "3"});
  const auto c = run_captured(o, dir);
  EXPECT_EQ(c.report.exit_code, 3) << c.err;
  EXPECT_EQ(c.report.restarts, 1);
  EXPECT_NE(c.out.find("[0]: TORCHELASTIC_RESTART_COUNT=0"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("[0]: TORCHELASTIC_RESTART_COUNT=1"), std::string::npos) << c.out;
  EXPECT_NE(c.err.find("restart 1 of 1"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("FAILED with exit code 3"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("(after 1 restart)"), std::string::npos) << c.err;
}

}  // namespace
}  // namespace paratrain::launch

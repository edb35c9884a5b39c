// Which run a restarted worker continues (restart_resume.h): its own launch's
// version even when another job made a newer one, the user's resume path when
// the run has not checkpointed yet, and nothing when the first generation
// never made a version. Folders and run.json only: no training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "paratrain/train/recovery/restart_resume.h"
#include "paratrain/train/run/run_dir.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_run.h"

namespace {

namespace fs = std::filesystem;
using paratrain::train::record_launch_id;
using paratrain::train::restart_resume;
using Overrides = std::vector<std::string>;

// <dir>/job/version_<v>, recording `launch_id`, with a committed checkpoint
// (a step directory holding index.json) when asked.
fs::path make_version(const std::string& dir, int v, const std::string& launch_id, bool checkpoint) {
  const fs::path run = paratrain::train::version_dir(fs::path(dir) / "job", v);
  fs::create_directories(run / "checkpoints");
  record_launch_id(run, launch_id);
  if (checkpoint) {
    fs::create_directories(run / "checkpoints" / "step_00000004");
    std::ofstream(run / "checkpoints" / "step_00000004" / "index.json") << "{}";
  }
  return run;
}

TEST(RestartResume, TheFirstGenerationChangesNothing) {
  const auto dir = paratrain::testing::temp_dir("restart0");
  const auto c = paratrain::testing::tiny_run_config(dir, "job", 1, 0);
  EXPECT_TRUE(restart_resume(c, "L1", 0).overrides.empty());
}

TEST(RestartResume, ARestartContinuesItsOwnLaunchsVersionNotTheNewest) {
  const auto dir = paratrain::testing::temp_dir("restart_own");
  make_version(dir, 0, "L0", true);
  make_version(dir, 1, "L1", true);  // this launch's
  make_version(dir, 2, "L2", true);  // another job's, started since
  const auto c = paratrain::testing::tiny_run_config(dir, "job", 1, 0);
  const auto plan = restart_resume(c, "L1", 1);
  EXPECT_EQ(plan.overrides, (Overrides{"run.version=1", "train.resume=auto"}));
  EXPECT_NE(plan.message.find("version_1 from its latest complete checkpoint"), std::string::npos) << plan.message;
}

TEST(RestartResume, AUserResumePathIsKeptUntilTheRunHasACheckpointOfItsOwn) {
  const auto dir = paratrain::testing::temp_dir("restart_path");
  make_version(dir, 0, "L1", false);
  auto c = paratrain::testing::tiny_run_config(dir, "job", 1, 0);
  c.train.resume = "/some/checkpoint";
  EXPECT_EQ(restart_resume(c, "L1", 1).overrides, (Overrides{"run.version=0"}));
  make_version(dir, 0, "L1", true);
  EXPECT_EQ(restart_resume(c, "L1", 2).overrides, (Overrides{"run.version=0", "train.resume=auto"}));
}

TEST(RestartResume, WithoutAVersionOfThisLaunchTheRunStartsAsConfigured) {
  const auto dir = paratrain::testing::temp_dir("restart_none");
  make_version(dir, 0, "other", true);
  const auto c = paratrain::testing::tiny_run_config(dir, "job", 1, 0);
  const auto plan = restart_resume(c, "L1", 1);
  EXPECT_TRUE(plan.overrides.empty());
  EXPECT_NE(plan.message.find("no run version of launch L1"), std::string::npos) << plan.message;
}

TEST(RestartResume, APinnedVersionOrNoLaunchIdResumesAutomatically) {
  const auto dir = paratrain::testing::temp_dir("restart_pinned");
  auto c = paratrain::testing::tiny_run_config(dir, "job", 1, 0);
  EXPECT_EQ(restart_resume(c, "none", 1).overrides, (Overrides{"train.resume=auto"}));
  EXPECT_EQ(restart_resume(c, "", 1).overrides, (Overrides{"train.resume=auto"}));
  c.run.version = 3;
  EXPECT_EQ(restart_resume(c, "L1", 1).overrides, (Overrides{"train.resume=auto"}));
}

}  // namespace

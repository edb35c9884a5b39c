// Run versions and what `paratrain runs` reads: re-running a config makes
// version_0, version_1, ...; train.resume = "auto" continues the newest;
// run.version picks one; run.json records the status. On thread ranks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/run/run_dir.h"
#include "paratrain/train/run/run_list.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_run.h"

namespace {

namespace fs = std::filesystem;
using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using paratrain::train::TrainResult;

TrainConfig tiny_config(const std::string& dir) {
  return paratrain::testing::tiny_run_config(dir, "job", /*epochs=*/1, /*log_every=*/0);
}

TrainResult fit(const TrainConfig& c, int world = 2) {
  std::vector<TrainResult> results(world);
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(c, g);
    results[g.rank()] = t.fit();
  });
  // Every rank wrote into the folder rank 0 chose.
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].run_dir, results[0].run_dir);
  return results[0];
}

nlohmann::json read_status(const fs::path& run_dir) {
  std::ifstream in(run_dir / "run.json");
  return nlohmann::json::parse(in);
}

TEST(RunVersions, ReRunningAConfigStartsTheNextVersion) {
  const auto dir = paratrain::testing::temp_dir("versions");
  auto c = tiny_config(dir);
  const auto first = fit(c);
  const auto second = fit(c);
  EXPECT_EQ(first.run_dir, fs::path(dir) / "job" / "version_0");
  EXPECT_EQ(second.run_dir, fs::path(dir) / "job" / "version_1");
  EXPECT_TRUE(fs::exists(second.run_dir / "checkpoints" / "step_00000004" / "index.json"));
  EXPECT_EQ(second.start_step, 0);  // a new version starts fresh

  // resume = auto continues the newest version: it is finished, so no step runs.
  c.train.resume = "auto";
  c.train.epochs = 2;
  const auto resumed = fit(c);
  EXPECT_EQ(resumed.run_dir, second.run_dir);
  EXPECT_EQ(resumed.start_step, 4);
  EXPECT_EQ(resumed.steps, 8);

  // run.version names one; with checkpoints there and no resume, it refuses.
  c.train.resume = "";
  c.run.version = 0;
  try {
    fit(c, 1);
    FAIL() << "expected a ConfigError";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("version_0 already holds checkpoints"), std::string::npos) << e.what();
  }
  EXPECT_EQ(paratrain::train::list_versions(fs::path(dir) / "job"), (std::vector<int64_t>{0, 1}));
}

TEST(RunVersions, RunJsonAndTheRunListTellWhatHappened) {
  const auto dir = paratrain::testing::temp_dir("runlist");
  auto c = tiny_config(dir);
  const auto done = fit(c);
  auto status = read_status(done.run_dir);
  EXPECT_EQ(status["status"], "finished");
  EXPECT_EQ(status["steps"], 4);
  EXPECT_EQ(status["world_size"], 2);

  // A run that fails records the error (the loss diverges at step 1).
  auto bad = c;
  bad.optimizer.lr = 1e30;
  bad.run.log_every = 1;
  EXPECT_THROW(fit(bad, 1), paratrain::Error);
  status = read_status(fs::path(dir) / "job" / "version_1");
  EXPECT_EQ(status["status"], "failed");
  EXPECT_NE(status["error"].get<std::string>().find("diverged"), std::string::npos) << status.dump();

  const auto runs = paratrain::train::list_runs(dir);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "job");
  EXPECT_EQ(runs[0].version, 0);
  EXPECT_EQ(runs[0].status, "finished");
  EXPECT_EQ(runs[0].steps, 4);
  EXPECT_EQ(runs[0].checkpoints, 1);
  EXPECT_EQ(runs[0].metric, "test_accuracy");
  EXPECT_NEAR(runs[0].best, done.test.accuracy, 1e-12);
  EXPECT_EQ(runs[1].status, "failed");
  const std::string table = paratrain::train::format_runs(runs);
  EXPECT_NE(table.find("finished"), std::string::npos) << table;

  // Tools given runs/job read its newest version.
  EXPECT_EQ(paratrain::train::resolve_run_dir(fs::path(dir) / "job"), fs::path(dir) / "job" / "version_1");
  EXPECT_EQ(paratrain::train::resolve_run_dir(done.run_dir), done.run_dir);
}

TEST(RunVersions, VersionNamesParseStrictly) {
  using paratrain::train::parse_version_name;
  EXPECT_EQ(parse_version_name("version_12"), 12);
  EXPECT_FALSE(parse_version_name("version_"));
  EXPECT_FALSE(parse_version_name("version_1a"));
  EXPECT_FALSE(parse_version_name("version_-1"));
  EXPECT_FALSE(parse_version_name("checkpoints"));
}

}  // namespace

// The user's path, in real processes: `paratrain launch ... train --set
// profile.steps=3-4`, then `paratrain trace RUN` (one Chrome trace of both
// ranks, valid Trace Event Format) and `paratrain profile RUN [--json]`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "paratrain/profile/chrome_trace.h"
#include "tests/support/multi_rank.h"

namespace {

namespace fs = std::filesystem;
using paratrain::testing::run_cli;

TEST(ProfileCli, LaunchTraceAndProfileAsAUserRunsThem) {
  const auto dir = paratrain::testing::temp_dir("cli-profile");
  const auto config = dir + "/job.toml";
  std::ofstream(config) << "[run]\nname = \"job\"\noutput_dir = \"" << dir << "/runs\"\nlog_every = 0\n"
                        << "[model]\nhidden = [32]\n"
                        << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 256\n"
                        << "synthetic_test_size = 64\nsynthetic_image_size = 8\nbatch_size = 16\n"
                        << "[train]\nepochs = 1\n[world]\ntimeout_s = 30\n";
  auto r = run_cli({"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", config, "--set",
                    "profile.steps=3-4"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("profile: steps 3-4 on every rank"), std::string::npos) << r.output;
  const std::string run = dir + "/runs/job";

  r = run_cli({"trace", run});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("from 2 profiled ranks"), std::string::npos) << r.output;
  std::ifstream in(run + "/version_0/trace.json");
  const auto trace = nlohmann::json::parse(in);
  EXPECT_EQ(paratrain::profile::trace_event_format_problem(trace), "");
  std::set<int> ranks_with_collectives;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "collective") ranks_with_collectives.insert(e["pid"].get<int>());
  EXPECT_EQ(ranks_with_collectives, (std::set<int>{0, 1}));

  r = run_cli({"profile", run});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exposed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("top operators by self time"), std::string::npos) << r.output;
  r = run_cli({"profile", run, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto summary = nlohmann::json::parse(r.output);
  EXPECT_EQ(summary["steps"].size(), 4u);  // 2 steps x 2 ranks
  EXPECT_EQ(summary["stragglers"].size(), 2u);

  const auto unprofiled = paratrain::testing::temp_dir("cli-profile-none");
  r = run_cli({"profile", unprofiled});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("profile.steps"), std::string::npos) << r.output;
}

}  // namespace

// `paratrain trace RUN_DIR` as a user runs it: two rank files written in the
// documented JSONL format become one Chrome trace and a bubble table; a run
// without trace files and a bad --steps fail with a message saying why.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/support/multi_rank.h"

namespace {

namespace fs = std::filesystem;
using paratrain::testing::run_cli;

// Two ranks of one step, hand-computed: span 0..100 us, rank 0 busy 60 us,
// rank 1 busy 68 us -> idle 40% and 32%, bubble 36%.
std::string fake_run() {
  const fs::path run = paratrain::testing::temp_dir("cli-trace");
  fs::create_directories(run / "trace");
  std::ofstream(run / "trace" / "rank_0.jsonl")
      << R"({"rank":0,"stage":0,"dp":0})" "\n"
      << R"({"kind":"forward","step":0,"mb":0,"chunk":-1,"peer":-1,"bytes":0,"start_us":500000,"end_us":500010})" "\n"
      << R"({"kind":"send","step":0,"mb":0,"chunk":-1,"peer":1,"bytes":64,"start_us":500010,"end_us":500012})" "\n"
      << R"({"kind":"forward","step":0,"mb":1,"chunk":-1,"peer":-1,"bytes":0,"start_us":500012,"end_us":500022})" "\n"
      << R"({"kind":"backward","step":0,"mb":0,"chunk":-1,"peer":-1,"bytes":0,"start_us":500040,"end_us":500060})" "\n"
      << R"({"kind":"backward","step":0,"mb":1,"chunk":-1,"peer":-1,"bytes":0,"start_us":500070,"end_us":500090})" "\n";
  std::ofstream(run / "trace" / "rank_1.jsonl")
      << R"({"rank":1,"stage":1,"dp":0})" "\n"
      << R"({"kind":"recv","step":0,"mb":0,"chunk":-1,"peer":0,"bytes":64,"start_us":500010,"end_us":500012})" "\n"
      << R"({"kind":"forward","step":0,"mb":0,"chunk":-1,"peer":-1,"bytes":0,"start_us":500012,"end_us":500022})" "\n"
      << R"({"kind":"backward","step":0,"mb":0,"chunk":-1,"peer":-1,"bytes":0,"start_us":500022,"end_us":500042})" "\n"
      << R"({"kind":"forward","step":0,"mb":1,"chunk":-1,"peer":-1,"bytes":0,"start_us":500042,"end_us":500052})" "\n"
      << R"({"kind":"backward","step":0,"mb":1,"chunk":-1,"peer":-1,"bytes":0,"start_us":500052,"end_us":500080})" "\n"
      << R"({"kind":"optimizer","step":0,"mb":-1,"chunk":-1,"peer":-1,"bytes":0,"start_us":500090,"end_us":500100})" "\n";
  return run.string();
}

TEST(TraceCli, WritesTheChromeTraceAndPrintsTheBubble) {
  const auto run = fake_run();
  const auto out = run + "/views/trace.json";
  auto r = run_cli({"trace", run, "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + out + ": 11 events from 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("36.0%"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("r0 40.0%  r1 32.0%"), std::string::npos) << r.output;

  std::ifstream in(out);
  const auto trace = nlohmann::json::parse(in);
  std::set<int> tids;
  std::set<std::string> rows;
  int64_t min_ts = -1;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") rows.insert(e.at("args").at("name").get<std::string>());
    if (e.at("ph") != "X") continue;
    tids.insert(e.at("tid").get<int>());
    min_ts = min_ts < 0 ? e.at("ts").get<int64_t>() : std::min(min_ts, e.at("ts").get<int64_t>());
  }
  EXPECT_EQ(tids, (std::set<int>{0, 1}));
  EXPECT_EQ(rows, (std::set<std::string>{"rank 0 (stage 0, dp 0)", "rank 1 (stage 1, dp 0)"}));
  EXPECT_EQ(min_ts, 0);
}

TEST(TraceCli, DefaultOutputIsInTheRunDirectory) {
  const auto run = fake_run();
  auto r = run_cli({"trace", run, "--steps", "0:0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(run + "/trace.json"));
}

TEST(TraceCli, RunWithoutTraceFilesOrBadStepsFails) {
  const auto empty = paratrain::testing::temp_dir("cli-trace-empty");
  auto r = run_cli({"trace", empty});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no pipeline timeline"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pipeline.trace_steps > 0"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(empty + "/trace.json"));

  r = run_cli({"trace", fake_run(), "--steps", "5:3"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expected A:B"), std::string::npos) << r.output;
}

}  // namespace

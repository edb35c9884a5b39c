// The profile summary's arithmetic on hand-made profiles whose answer is
// known (Note [Where a step's time went] in paratrain/profile/summary.cpp),
// the interval sets under it, and the Trace Event Format check.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/core/phase.h"
#include "paratrain/profile/chrome_trace.h"
#include "paratrain/profile/intervals.h"
#include "paratrain/profile/summary.h"

namespace pp = paratrain::profile;

namespace {

pp::OpEvent op(const std::string& name, int64_t start, int64_t dur, uint64_t thread = 1, bool phase = false) {
  pp::OpEvent e;
  e.name = name;
  e.start_us = start;
  e.dur_us = dur;
  e.thread = thread;
  e.user_scope = phase;
  return e;
}

pp::CommEvent comm(int64_t start, int64_t end, int64_t bytes = 400) {
  pp::CommEvent c;
  c.op = "all_reduce";
  c.group = "world";
  c.bytes = bytes;
  c.start_us = start;
  c.end_us = end;
  c.state = "done";
  return c;
}

// One step [1000, 1100) us: data [1000, 1010), forward ops [1010, 1050), an
// all-reduce [1040, 1070), the optimizer phase [1080, 1100) with an op
// [1085, 1095). Expected (us): data 10, compute 40, optimizer 10, exposed
// 20 ([1050, 1070)), overlapped 10 ([1040, 1050)), idle 20. `extra_wait_us`
// makes the all-reduce that much longer and moves what follows it.
pp::RankProfile known_step(int rank, int64_t extra_wait_us = 0) {
  pp::RankProfile p;
  p.rank = rank;
  p.loop_thread = 1;
  p.steps.push_back({7, 1000, 1100 + extra_wait_us});
  p.events = {op(paratrain::kPhaseData, 1000, 10, 1, true), op("aten::index", 1001, 5),
              op(paratrain::kPhaseForward, 1010, 40, 1, true), op("aten::addmm", 1010, 30), op("aten::relu", 1040, 10),
              op(paratrain::kPhaseOptimizer, 1080 + extra_wait_us, 20, 1, true),
              op("aten::add_", 1085 + extra_wait_us, 10),
              op("gloo:all_reduce", 1040, 30),  // the backend's own record: not compute
              op("aten::mm", 1010, 500, 2)};    // another thread: not the loop's time
  p.collectives = {comm(1040, 1070 + extra_wait_us)};
  return p;
}

}  // namespace

TEST(Intervals, UnionIntersectionAndDifference) {
  pp::Intervals a({{0, 10}, {5, 20}, {30, 40}});
  EXPECT_EQ(a.length(), 30);
  pp::Intervals b({{15, 35}});
  EXPECT_EQ(a.intersect(b).length(), 10);  // [15, 20) and [30, 35)
  EXPECT_EQ(a.minus(b).length(), 20);      // [0, 15) and [35, 40)
  EXPECT_EQ(a.unite(b).length(), 40);
  EXPECT_EQ(a.clip(8, 32).length(), 14);   // [8, 20) and [30, 32)
  EXPECT_EQ(pp::Intervals({{5, 5}, {7, 3}}).length(), 0);
}

TEST(ProfileSummary, SplitsAStepIntoPartsThatAddUpToItsWallTime) {
  const auto s = pp::summarize({known_step(0)});
  ASSERT_EQ(s.steps.size(), 1u);
  const auto& b = s.steps[0];
  EXPECT_EQ(b.step, 7);
  EXPECT_DOUBLE_EQ(b.wall_ms, 0.100);
  EXPECT_DOUBLE_EQ(b.data_ms, 0.010);
  EXPECT_DOUBLE_EQ(b.compute_ms, 0.040);
  EXPECT_DOUBLE_EQ(b.optimizer_ms, 0.010);
  EXPECT_DOUBLE_EQ(b.exposed_comm_ms, 0.020);
  EXPECT_DOUBLE_EQ(b.overlapped_comm_ms, 0.010);
  EXPECT_DOUBLE_EQ(b.idle_ms, 0.020);
  EXPECT_EQ(b.comm_bytes, 400);
  EXPECT_EQ(b.collectives, 1);
}

TEST(ProfileSummary, TheStragglerIsTheRankTheOthersWaitedFor) {
  // Rank 1 waited 30 us longer in its all-reduce: rank 0 was late.
  const auto s = pp::summarize({known_step(0), known_step(1, 30)});
  ASSERT_EQ(s.stragglers.size(), 1u);
  EXPECT_EQ(s.stragglers[0].rank, 0);
  EXPECT_EQ(s.stragglers[0].waiting_rank, 1);
  EXPECT_NEAR(s.stragglers[0].waited_ms, 0.030, 1e-12);
}

TEST(ProfileSummary, SelfTimeExcludesTheOperatorsInside) {
  pp::RankProfile p;
  p.loop_thread = 1;
  p.steps.push_back({1, 0, 100});
  p.events = {op("aten::linear", 0, 50), op("aten::addmm", 10, 30), op("aten::t", 12, 4)};
  const auto s = pp::summarize({p});
  auto find = [&](const std::string& name) {
    return *std::find_if(s.top_ops.begin(), s.top_ops.end(), [&](const pp::OpStat& o) { return o.name == name; });
  };
  EXPECT_DOUBLE_EQ(find("aten::linear").self_ms, 0.020);
  EXPECT_DOUBLE_EQ(find("aten::addmm").self_ms, 0.026);
  EXPECT_DOUBLE_EQ(find("aten::addmm").total_ms, 0.030);
  EXPECT_EQ(s.top_ops.front().name, "aten::addmm");
}

TEST(ChromeTrace, IsTraceEventFormatAndTheCheckCatchesViolations) {
  const nlohmann::json trace = pp::chrome_trace({known_step(0), known_step(1, 30)});
  EXPECT_EQ(pp::trace_event_format_problem(trace), "");
  int collectives = 0;
  for (const auto& e : trace["traceEvents"]) collectives += e.value("cat", "") == "collective";
  EXPECT_EQ(collectives, 2);
  // The check is not a rubber stamp.
  nlohmann::json bad = trace;
  bad["traceEvents"][5].erase("ph");
  EXPECT_NE(pp::trace_event_format_problem(bad), "");
  bad = trace;
  for (auto& e : bad["traceEvents"])
    if (e["ph"] == "X") {
      e["dur"] = -1;
      break;
    }
  EXPECT_NE(pp::trace_event_format_problem(bad), "");
  EXPECT_NE(pp::trace_event_format_problem(nlohmann::json::array()), "");
}

TEST(RankProfileFile, RoundTripsThroughJson) {
  const pp::RankProfile p = known_step(3, 5);
  const pp::RankProfile back = pp::rank_profile_from_json(pp::to_json(p), "<test>");
  EXPECT_EQ(back.rank, 3);
  ASSERT_EQ(back.events.size(), p.events.size());
  EXPECT_EQ(back.events[1].name, "aten::index");
  EXPECT_EQ(back.collectives[0].end_us, 1075);
  EXPECT_THROW(pp::rank_profile_from_json(nlohmann::json{{"format", "other"}}, "<test>"), paratrain::ConfigError);
}

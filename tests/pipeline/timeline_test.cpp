// Pipeline timelines: recording to the rank files and reading them back,
// strict parsing, the measured bubble against hand-computed values (and the
// GPipe formula), and the Chrome trace they become.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/chrome_trace.h"
#include "paratrain/pipeline/timeline.h"
#include "tests/support/multi_rank.h"

namespace {

namespace fs = std::filesystem;
using namespace paratrain::pipeline;
using nlohmann::json;

TimelineEvent ev(EventKind kind, int64_t step, int mb, int64_t start, int64_t end, int peer = -1, int chunk = -1,
                 int64_t bytes = 0) {
  return TimelineEvent{kind, step, mb, chunk, peer, bytes, start, end};
}

void expect_same(const TimelineEvent& a, const TimelineEvent& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.microbatch, b.microbatch);
  EXPECT_EQ(a.chunk, b.chunk);
  EXPECT_EQ(a.peer, b.peer);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.start_us, b.start_us);
  EXPECT_EQ(a.end_us, b.end_us);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const paratrain::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Timeline, RecordsToTheRankFileAndReadsBack) {
  const fs::path run = paratrain::testing::temp_dir("timeline-roundtrip");
  const fs::path file = timeline_path(run, 3);
  EXPECT_EQ(file, run / "trace" / "rank_3.jsonl");
  Timeline timeline(3, {.path = file, .max_steps = 2, .stage = 1, .dp = 0});
  EXPECT_FALSE(fs::exists(file));  // nothing recorded yet: no file
  const std::vector<TimelineEvent> in = {
      ev(EventKind::kRecv, 5, 0, 100, 110, /*peer=*/2, -1, 4096), ev(EventKind::kForward, 5, 0, 110, 150),
      ev(EventKind::kSend, 5, 0, 150, 155, /*peer=*/4, -1, 4096), ev(EventKind::kBackward, 5, 0, 200, 290, -1, 1),
      ev(EventKind::kRecompute, 6, 1, 300, 320),                  ev(EventKind::kWait, 6, -1, 320, 330),
      ev(EventKind::kOptimizer, 6, -1, 330, 340),
  };
  for (const auto& e : in) timeline.record(e);
  timeline.end_step(5);
  timeline.record(ev(EventKind::kForward, 7, 0, 400, 410));  // step 7 >= first step 5 + max_steps 2: dropped
  timeline.end_step(6);
  EXPECT_FALSE(timeline.recording(7));
  EXPECT_FALSE(timeline.recording(4));
  EXPECT_TRUE(timeline.recording(6));
  ASSERT_EQ(timeline.events().size(), in.size());

  const auto back = read_rank_timeline(file);
  EXPECT_EQ(back.header.rank, 3);
  EXPECT_EQ(back.header.stage, 1);
  EXPECT_EQ(back.header.dp, 0);
  ASSERT_EQ(back.events.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) expect_same(back.events[i], in[i]);
  EXPECT_EQ(read_timeline(file).size(), in.size());
}

TEST(Timeline, ScopeRecordsItsLifetimeOnlyWhenRecording) {
  Timeline timeline(0, {.path = {}, .max_steps = 1});
  {
    Timeline::Scope s(timeline, {EventKind::kForward, 2, 3, 0});
    Timeline::Scope none(nullptr, {EventKind::kForward, 2, 3, 0});  // no timeline: a no-op
  }
  ASSERT_EQ(timeline.events().size(), 1u);
  const auto& e = timeline.events()[0];
  EXPECT_EQ(e.kind, EventKind::kForward);
  EXPECT_EQ(e.step, 2);
  EXPECT_EQ(e.microbatch, 3);
  EXPECT_GT(e.start_us, 0);
  EXPECT_LE(e.start_us, e.end_us);
  { Timeline::Scope later(timeline, {EventKind::kBackward, 3, 0}); }  // step 3 is past max_steps
  EXPECT_EQ(timeline.events().size(), 1u);
}

TEST(Timeline, MaxStepsZeroRecordsNothingAndWritesNoFile) {
  const fs::path run = paratrain::testing::temp_dir("timeline-off");
  Timeline timeline(0, {.path = timeline_path(run, 0), .max_steps = 0});
  EXPECT_FALSE(timeline.recording(0));
  timeline.record(ev(EventKind::kForward, 0, 0, 1, 2));
  timeline.end_step(0);
  EXPECT_TRUE(timeline.events().empty());
  EXPECT_FALSE(fs::exists(timeline_path(run, 0)));
  EXPECT_NE(error_of([&] { read_run_timelines(run); }).find("pipeline.trace_steps > 0"), std::string::npos);
}

TEST(Timeline, MalformedLinesAreReportedWithFileAndLine) {
  const fs::path dir = paratrain::testing::temp_dir("timeline-bad");
  const std::string header = R"({"rank":0,"stage":0,"dp":0})";
  const std::string good = R"({"kind":"forward","step":0,"mb":0,"chunk":-1,"peer":-1,"bytes":0,"start_us":1,"end_us":2})";
  auto read_lines = [&](const std::string& text) {
    const fs::path file = dir / "rank_0.jsonl";
    std::ofstream(file, std::ios::trunc) << text;
    return error_of([&] { read_timeline(file); });
  };
  auto msg = read_lines(header + "\n" + good + "\n{\"kind\":\"forward\",\n" + good + "\n");
  EXPECT_NE(msg.find("rank_0.jsonl:3: not valid JSON"), std::string::npos) << msg;
  msg = read_lines(header + "\n" + good + "\n" + good + "\n" + R"({"kind":"sideways","step":0,"start_us":1,"end_us":2})" + "\n");
  EXPECT_NE(msg.find("rank_0.jsonl:4: unknown kind \"sideways\""), std::string::npos) << msg;
  msg = read_lines(header + "\n" + R"({"kind":"send","step":0,"start_us":5,"end_us":2})" + "\n");
  EXPECT_NE(msg.find(":2: end_us 2 is before start_us 5"), std::string::npos) << msg;
  msg = read_lines(header + "\n" + R"({"kind":"send","step":"zero","start_us":1,"end_us":2})" + "\n");
  EXPECT_NE(msg.find(":2: \"step\" is \"zero\", expected an integer"), std::string::npos) << msg;
  msg = read_lines(good + "\n" + header + "\n");
  EXPECT_NE(msg.find(":2: neither an event"), std::string::npos) << msg;
  // A last line cut short by a crash (no newline) is dropped, not an error.
  const fs::path file = dir / "rank_0.jsonl";
  std::ofstream(file, std::ios::trunc) << header << "\n" << good << "\n" << good.substr(0, 20);
  EXPECT_EQ(read_timeline(file).size(), 1u);
}

TEST(Timeline, RunTimelinesAreOrderedByRankAndHeadersMustMatchFileNames) {
  const fs::path run = paratrain::testing::temp_dir("timeline-run");
  for (int r : {2, 0, 1}) {
    Timeline t(r, {.path = timeline_path(run, r), .stage = r, .dp = 0});
    t.record(ev(EventKind::kForward, 0, 0, 10 * r, 10 * r + 5));
    t.end_step(0);
  }
  const auto ranks = read_run_timelines(run);
  ASSERT_EQ(ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ranks[r].header.rank, r);
  fs::copy_file(timeline_path(run, 2), timeline_path(run, 7));
  EXPECT_NE(error_of([&] { read_run_timelines(run); }).find("header says rank 2 but the file name says rank 7"),
            std::string::npos);
}

// Two ranks, hand-computed (times in us). Rank 0: compute 10 + 10 + 20 + 20 =
// 60; rank 1: 10 + 20 + 10 + 28 = 68; span 0..100 (rank 1's optimizer ends
// last) = 100. Idle shares 0.40 and 0.32, bubble 0.36. The sends/receives and
// the optimizer widen the span but are not busy time; step 1 is ignored.
TEST(MeasureBubble, TwoRanksMatchTheHandComputedValue) {
  const std::vector<std::vector<TimelineEvent>> per_rank = {
      {ev(EventKind::kForward, 0, 0, 0, 10), ev(EventKind::kSend, 0, 0, 10, 12, 1),
       ev(EventKind::kForward, 0, 1, 12, 22), ev(EventKind::kBackward, 0, 0, 40, 60),
       ev(EventKind::kBackward, 0, 1, 70, 90), ev(EventKind::kForward, 1, 0, 200, 300)},
      {ev(EventKind::kRecv, 0, 0, 10, 12, 0), ev(EventKind::kForward, 0, 0, 12, 22),
       ev(EventKind::kBackward, 0, 0, 22, 42), ev(EventKind::kForward, 0, 1, 42, 52),
       ev(EventKind::kBackward, 0, 1, 52, 80), ev(EventKind::kOptimizer, 0, -1, 90, 100)},
  };
  const auto r = measure_bubble(per_rank, 0);
  EXPECT_EQ(r.step, 0);
  EXPECT_DOUBLE_EQ(r.span_us, 100.0);
  ASSERT_EQ(r.idle_share.size(), 2u);
  EXPECT_NEAR(r.idle_share[0], 0.40, 1e-12);
  EXPECT_NEAR(r.idle_share[1], 0.32, 1e-12);
  EXPECT_NEAR(r.bubble, 0.36, 1e-12);
  EXPECT_EQ(recorded_steps(per_rank), (std::vector<int64_t>{0, 1}));
  EXPECT_NE(error_of([&] { measure_bubble(per_rank, 5); }).find("no rank recorded an event of step 5"),
            std::string::npos);
  const auto table = format_bubbles({r}, {0, 1});
  EXPECT_NE(table.find("36.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("r1 32.0%"), std::string::npos) << table;
}

// GPipe with p stages, m micro-batches and unit-time forward and backward:
// the bubble is (p - 1) / (m + p - 1) (Huang et al., 2019). Stage s runs
// forward of micro-batch i at s + i, backward at (m + p - 1) + (p - 1 - s) + i.
TEST(MeasureBubble, GPipeScheduleGivesThePaperFormula) {
  const int p = 4, m = 8;
  const int64_t unit = 1000;
  std::vector<std::vector<TimelineEvent>> per_rank(p);
  for (int s = 0; s < p; ++s) {
    for (int i = 0; i < m; ++i) {
      per_rank[s].push_back(ev(EventKind::kForward, 3, i, (s + i) * unit, (s + i + 1) * unit));
      const int64_t b = (m + p - 1) + (p - 1 - s) + i;
      per_rank[s].push_back(ev(EventKind::kBackward, 3, i, b * unit, (b + 1) * unit));
    }
  }
  const auto r = measure_bubble(per_rank, 3);
  EXPECT_DOUBLE_EQ(r.span_us, 2.0 * (m + p - 1) * unit);
  EXPECT_NEAR(r.bubble, double(p - 1) / (m + p - 1), 1e-12);
  // A rank that recorded nothing is idle throughout.
  per_rank.emplace_back();
  EXPECT_DOUBLE_EQ(measure_bubble(per_rank, 3).idle_share.back(), 1.0);
}

// Back-to-back steps: stage 1 posts step 1's receive (at 80) while stage 0
// still runs step 0's last backward (to 100). Step 1's span starts at its
// first forward (100), so the 20 us of waiting count once, in step 0.
TEST(MeasureBubble, AReceivePostedDuringThePreviousStepDoesNotWidenTheSpan) {
  const std::vector<std::vector<TimelineEvent>> per_rank = {
      {ev(EventKind::kForward, 1, 0, 100, 110), ev(EventKind::kBackward, 1, 0, 140, 160)},
      {ev(EventKind::kRecv, 1, 0, 80, 110, 0), ev(EventKind::kForward, 1, 0, 110, 120),
       ev(EventKind::kBackward, 1, 0, 120, 140)},
  };
  const auto r = measure_bubble(per_rank, 1);
  EXPECT_DOUBLE_EQ(r.span_us, 60.0);
  EXPECT_NEAR(r.idle_share[0], 0.5, 1e-12);
  EXPECT_NEAR(r.idle_share[1], 0.5, 1e-12);
}

class ChromeTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ = paratrain::testing::temp_dir("chrome-trace");
    Timeline r0(0, {.path = timeline_path(run_, 0), .stage = 0, .dp = 0});
    r0.record(ev(EventKind::kForward, 0, 3, 1000, 1400));
    r0.record(ev(EventKind::kSend, 0, 3, 1400, 1450, /*peer=*/1, -1, 512));
    r0.record(ev(EventKind::kBackward, 0, 3, 2000, 2600, -1, /*chunk=*/1));
    r0.end_step(0);
    r0.record(ev(EventKind::kForward, 1, 0, 5000, 5300));
    r0.end_step(1);
    Timeline r1(1, {.path = timeline_path(run_, 1), .stage = 1, .dp = 0});
    r1.record(ev(EventKind::kRecv, 0, 3, 1100, 1460, /*peer=*/0, -1, 512));
    r1.record(ev(EventKind::kForward, 0, 3, 1460, 1900));
    r1.end_step(0);
    r1.record(ev(EventKind::kRecompute, 1, 0, 5400, 5500));
    r1.end_step(1);
  }
  fs::path run_;
};

json read_json(const fs::path& file) {
  std::ifstream in(file);
  return json::parse(in);
}

TEST_F(ChromeTrace, OneNamedRowPerRankWithShiftedTimestamps) {
  const fs::path out = run_ / "out" / "trace.json";
  const int64_t count = write_chrome_trace(run_, out);
  EXPECT_EQ(count, 7);
  const json trace = read_json(out);
  std::map<int, std::string> thread_names;
  std::set<int> tids;
  std::map<std::string, json> by_name;
  int64_t min_ts = -1;
  bool process_named = false;
  for (const auto& e : trace.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 0);
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") process_named = e.at("args").at("name") == "pipeline";
      if (e.at("name") == "thread_name") thread_names[e.at("tid")] = e.at("args").at("name");
      continue;
    }
    ASSERT_EQ(e.at("ph"), "X");
    tids.insert(e.at("tid").get<int>());
    const int64_t ts = e.at("ts");
    min_ts = min_ts < 0 ? ts : std::min(min_ts, ts);
    by_name[e.at("name").get<std::string>() + "@" + std::to_string(e.at("tid").get<int>())] = e;
  }
  EXPECT_TRUE(process_named);
  EXPECT_EQ(tids, (std::set<int>{0, 1}));
  EXPECT_EQ(thread_names[0], "rank 0 (stage 0, dp 0)");
  EXPECT_EQ(thread_names[1], "rank 1 (stage 1, dp 0)");
  EXPECT_EQ(min_ts, 0);  // the earliest event (rank 0's F3 at 1000 us) is at 0
  ASSERT_TRUE(by_name.count("F3@0"));
  EXPECT_EQ(by_name["F3@0"].at("ts"), 0);
  EXPECT_EQ(by_name["F3@0"].at("dur"), 400);
  ASSERT_TRUE(by_name.count("B3.c1@0"));
  EXPECT_EQ(by_name["B3.c1@0"].at("ts"), 1000);
  EXPECT_EQ(by_name["B3.c1@0"].at("dur"), 600);
  ASSERT_TRUE(by_name.count("send→1@0"));
  EXPECT_EQ(by_name["send→1@0"].at("args").at("bytes"), 512);
  ASSERT_TRUE(by_name.count("recv←0@1"));
  EXPECT_EQ(by_name["recv←0@1"].at("ts"), 100);
  EXPECT_EQ(by_name["recv←0@1"].at("dur"), 360);
  EXPECT_EQ(by_name["recv←0@1"].at("args").at("step"), 0);
  EXPECT_EQ(by_name["recv←0@1"].at("args").at("microbatch"), 3);
  EXPECT_TRUE(by_name.count("R0@1"));
  // Written through a temporary file that is gone afterwards.
  int files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(run_ / "out")) ++files;
  EXPECT_EQ(files, 1);
}

TEST_F(ChromeTrace, StepRangeSelectsEventsAndShiftsToItsFirstEvent) {
  const fs::path out = run_ / "step1.json";
  EXPECT_EQ(write_chrome_trace(run_, out, {.first_step = 1, .last_step = 1}), 2);
  const json trace = read_json(out);
  std::map<std::string, int64_t> ts;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") ts[e.at("name")] = e.at("ts");
  }
  EXPECT_EQ(ts, (std::map<std::string, int64_t>{{"F0", 0}, {"R0", 400}}));
  const auto msg = error_of([&] { write_chrome_trace(run_, out, {.first_step = 4, .last_step = {}}); });
  EXPECT_NE(msg.find("recorded steps: 0..1"), std::string::npos) << msg;
}

TEST_F(ChromeTrace, RunWithoutTraceFilesSaysHowToGetThem) {
  const fs::path empty = paratrain::testing::temp_dir("chrome-trace-empty");
  const auto msg = error_of([&] { write_chrome_trace(empty, empty / "trace.json"); });
  EXPECT_NE(msg.find("pipeline.trace_steps > 0"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(empty / "trace.json"));
}

}  // namespace

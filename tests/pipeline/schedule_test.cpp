// Pipeline schedules (schedule.h): every schedule runs each forward and
// backward exactly once and in a legal order on every stage, its sections
// (warm-up, steady 1F1B, cool-down) match hand-worked cases from the papers,
// its activation peak is what the papers promise, and config mistakes name
// their keys. Timing and deadlock freedom are in simulate_test.cpp.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/schedule.h"

namespace paratrain::pipeline {
namespace {

struct Grid {
  ScheduleKind kind;
  ScheduleOptions options;
};

// The grid from the issue: p in {1,2,4}; m in {1, p-1, p, 2p+1} for GPipe and
// 1F1B; m in {p, 2p} and v in {2, 3} for interleaved (m % p == 0 is required).
std::vector<Grid> grid() {
  std::vector<Grid> cases;
  for (int p : {1, 2, 4}) {
    for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB}) {
      for (int m : {1, p - 1, p, 2 * p + 1}) {
        if (m >= 1) cases.push_back({kind, {p, m, 1}});
      }
    }
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p}) cases.push_back({ScheduleKind::kInterleaved1F1B, {p, m, v}});
    }
  }
  return cases;
}

std::string label(const Grid& g, int stage) {
  return schedule_name(g.kind) + " p=" + std::to_string(g.options.stages) + " m=" +
         std::to_string(g.options.microbatches) + " v=" + std::to_string(g.options.virtual_stages) +
         " stage=" + std::to_string(stage);
}

Action F(int mb, int chunk = 0) { return {ActionKind::kForward, mb, chunk}; }
Action B(int mb, int chunk = 0) { return {ActionKind::kBackward, mb, chunk}; }

std::string show(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) out += to_string(a) + " ";
  return out;
}

TEST(Schedule, EveryPassExactlyOnceAndBackwardAfterForward) {
  for (const Grid& g : grid()) {
    for (int s = 0; s < g.options.stages; ++s) {
      const std::vector<Action> actions = make_schedule(g.kind, g.options, s);
      // Counted here independently of verify_schedule, which is checked below.
      std::map<std::pair<int, int>, int> forwards, backwards;
      for (const Action& a : actions) {
        ASSERT_GE(a.microbatch, 0) << label(g, s);
        ASSERT_LT(a.microbatch, g.options.microbatches) << label(g, s);
        ASSERT_GE(a.chunk, 0) << label(g, s);
        ASSERT_LT(a.chunk, g.options.virtual_stages) << label(g, s);
        if (a.kind == ActionKind::kForward) {
          ++forwards[{a.microbatch, a.chunk}];
        } else {
          const std::pair<int, int> key{a.microbatch, a.chunk};
          EXPECT_EQ(forwards[key], 1) << label(g, s) << ": " << to_string(a) << " before its forward";
          ++backwards[key];
        }
      }
      const std::size_t n = static_cast<std::size_t>(g.options.microbatches) * g.options.virtual_stages;
      EXPECT_EQ(actions.size(), 2 * n) << label(g, s);
      EXPECT_EQ(forwards.size(), n) << label(g, s);
      EXPECT_EQ(backwards.size(), n) << label(g, s);
      for (const auto& [key, count] : backwards) EXPECT_EQ(count, 1) << label(g, s);
      EXPECT_NO_THROW(verify_schedule(actions, g.options, s)) << label(g, s);
    }
  }
}

TEST(Schedule, VerifyRejectsBrokenSchedules) {
  const ScheduleOptions o{2, 2, 1};
  EXPECT_THROW(verify_schedule({F(0), B(0), F(1)}, o, 0), Error);               // missing B(1)
  EXPECT_THROW(verify_schedule({F(0), F(0), B(0), F(1), B(1)}, o, 0), Error);   // forward twice
  EXPECT_THROW(verify_schedule({B(0), F(0), F(1), B(1)}, o, 0), Error);         // backward first
  EXPECT_THROW(verify_schedule({F(0), F(2), B(0), B(2)}, o, 0), Error);         // no micro-batch 2
  try {
    verify_schedule({F(0), B(1), F(1), B(0)}, o, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("B(mb 1, chunk 0)"), std::string::npos) << e.what();
  }
}

// PipeDream-Flush on p=4, m=8 (Narayanan et al., figure 4): stage 0 runs
// p - 0 - 1 = 3 warm-up forwards, the last stage none.
TEST(Schedule, OneFOneBSectionsHandChecked) {
  const ScheduleOptions o{4, 8, 1};
  EXPECT_EQ(show(one_f_one_b_schedule(o, 0)),
            show({F(0), F(1), F(2),                                                       // warm-up
                  F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3), F(7), B(4),             // steady
                  B(5), B(6), B(7)}));                                                    // cool-down
  EXPECT_EQ(show(one_f_one_b_schedule(o, 2)),  // 4 - 2 - 1 = 1 warm-up forward
            show({F(0), F(1), B(0), F(2), B(1), F(3), B(2), F(4), B(3), F(5), B(4), F(6), B(5), F(7), B(6), B(7)}));
  EXPECT_EQ(show(one_f_one_b_schedule(o, 3)),
            show({F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4), F(5), B(5), F(6), B(6), F(7), B(7)}));
  // Fewer micro-batches than stages: warm-up is capped at m, no steady state.
  EXPECT_EQ(show(one_f_one_b_schedule({4, 2, 1}, 0)), show({F(0), F(1), B(0), B(1)}));
  EXPECT_EQ(show(gpipe_schedule({4, 3, 1}, 1)), show({F(0), F(1), F(2), B(0), B(1), B(2)}));
}

// Interleaved, p=2, v=2, m=4 worked by hand from the paper's rule: forward k
// runs local chunk (k/p)%v of micro-batch (k/(p*v))*p + k%p; stage 0 warms up
// with (2-0-1)*2 + (2-1)*2 = 4 forwards, stage 1 with 0*2 + 1*2 = 2.
TEST(Schedule, InterleavedSectionsHandChecked) {
  const ScheduleOptions o{2, 4, 2};
  EXPECT_EQ(show(interleaved_1f1b_schedule(o, 0)),
            show({F(0, 0), F(1, 0), F(0, 1), F(1, 1),                                     // warm-up
                  F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0), // steady
                  B(2, 1), B(3, 1), B(2, 0), B(3, 0)}));                                  // cool-down
  EXPECT_EQ(show(interleaved_1f1b_schedule(o, 1)),
            show({F(0, 0), F(1, 0),                                                       // warm-up
                  F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0), B(0, 0), F(3, 0), B(1, 0), F(2, 1), B(2, 1),
                  F(3, 1), B(3, 1),                                                       // steady
                  B(2, 0), B(3, 0)}));                                                    // cool-down
}

// Activation memory, in chunks alive at once:
// - GPipe: all m on every stage.
// - 1F1B: min(p - s, m) on stage s (warm-up plus the steady forward).
// - Interleaved, stage 0: its warm-up (v+1)p - 2 plus one, capped at m*v. For
//   m = 2p that is (v+1)p - 1 < m*v chunks; for m = p the warm-up covers every
//   forward and it equals GPipe's m*v (as in Megatron, where m == p means
//   "all warm-up"). A chunk is 1/v of a stage, so in stage units that is
//   ((v+1)p - 1)/v, a little over 1F1B's p: the paper's memory cost of interleaving.
TEST(Schedule, PeakInFlight) {
  for (const Grid& g : grid()) {
    const int p = g.options.stages, m = g.options.microbatches, v = g.options.virtual_stages;
    for (int s = 0; s < p; ++s) {
      const int peak = peak_in_flight(make_schedule(g.kind, g.options, s));
      switch (g.kind) {
        case ScheduleKind::kGpipe: EXPECT_EQ(peak, m) << label(g, s); break;
        case ScheduleKind::kOneFOneB: EXPECT_EQ(peak, std::min(p - s, m)) << label(g, s); break;
        case ScheduleKind::kInterleaved1F1B:
          if (s == 0) {
            EXPECT_EQ(peak, std::min((v + 1) * p - 1, m * v)) << label(g, s);
          }
          if (m == 2 * p) {
            EXPECT_LT(peak, m * v) << label(g, s);
          }
          EXPECT_LE(peak, m * v) << label(g, s);
          break;
      }
    }
  }
  // The saving 1F1B exists for: with m > p, stage 0 keeps p alive, GPipe m.
  EXPECT_EQ(peak_in_flight(one_f_one_b_schedule({4, 16, 1}, 0)), 4);
  EXPECT_EQ(peak_in_flight(gpipe_schedule({4, 16, 1}, 0)), 16);
}

TEST(Schedule, TheoreticalBubble) {
  EXPECT_DOUBLE_EQ(theoretical_bubble(ScheduleKind::kGpipe, {4, 8, 1}), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(ScheduleKind::kOneFOneB, {4, 8, 1}), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(ScheduleKind::kInterleaved1F1B, {4, 8, 2}), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(ScheduleKind::kOneFOneB, {1, 5, 1}), 0.0);
}

std::string config_error(ScheduleKind kind, const ScheduleOptions& o) {
  try {
    validate_schedule(kind, o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool mentions(const std::string& message, const std::string& what) { return message.find(what) != std::string::npos; }

TEST(Schedule, ParseAndValidateErrorsNameTheirKeys) {
  EXPECT_EQ(parse_schedule("gpipe"), ScheduleKind::kGpipe);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(parse_schedule("interleaved_1f1b"), ScheduleKind::kInterleaved1F1B);
  for (ScheduleKind k : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved1F1B}) {
    EXPECT_EQ(parse_schedule(schedule_name(k)), k);
  }
  try {
    parse_schedule("pipedream");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const char* want : {"pipeline.schedule", "pipedream", "gpipe", "1f1b", "interleaved_1f1b"}) {
      EXPECT_TRUE(mentions(msg, want)) << want << " not in: " << msg;
    }
  }

  std::string msg = config_error(ScheduleKind::kOneFOneB, {0, 4, 1});
  EXPECT_TRUE(mentions(msg, "parallel.pp = 0")) << msg;
  msg = config_error(ScheduleKind::kGpipe, {2, 0, 1});
  EXPECT_TRUE(mentions(msg, "pipeline.microbatches = 0")) << msg;
  msg = config_error(ScheduleKind::kOneFOneB, {2, 4, 2});
  EXPECT_TRUE(mentions(msg, "pipeline.virtual_stages = 2") && mentions(msg, "1f1b")) << msg;
  msg = config_error(ScheduleKind::kInterleaved1F1B, {2, 4, 1});
  EXPECT_TRUE(mentions(msg, "pipeline.virtual_stages = 1") && mentions(msg, "interleaved_1f1b")) << msg;
  msg = config_error(ScheduleKind::kInterleaved1F1B, {4, 6, 2});
  EXPECT_TRUE(mentions(msg, "pipeline.microbatches = 6") && mentions(msg, "parallel.pp = 4")) << msg;
  EXPECT_EQ(config_error(ScheduleKind::kInterleaved1F1B, {4, 8, 2}), "");

  // The dispatcher validates too, and a stage outside the pipeline is the caller's mistake.
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved1F1B, {4, 6, 2}, 0), ConfigError);
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, {4, 8, 1}, 4), c10::Error);
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, {4, 8, 1}, -1), c10::Error);
}

}  // namespace
}  // namespace paratrain::pipeline

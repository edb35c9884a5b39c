// The pipeline simulator (simulate.h) on every schedule: none deadlocks on the
// issue's grid, GPipe and 1F1B reach the textbook bubble (p-1)/(m+p-1) exactly
// with uniform costs, interleaving beats it, and broken schedules are caught
// as deadlocks (the negative controls proving the check can fail).
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "paratrain/core/error.h"
#include "paratrain/pipeline/simulate.h"

namespace paratrain::pipeline {
namespace {

Action F(int mb, int chunk = 0) { return {ActionKind::kForward, mb, chunk}; }
Action B(int mb, int chunk = 0) { return {ActionKind::kBackward, mb, chunk}; }

std::string label(ScheduleKind kind, const ScheduleOptions& o) {
  return schedule_name(kind) + " p=" + std::to_string(o.stages) + " m=" + std::to_string(o.microbatches) +
         " v=" + std::to_string(o.virtual_stages);
}

// Each stage's timeline holds its whole schedule, in order, without overlap,
// and every pass starts no earlier than the passes it needs ended.
void expect_consistent(ScheduleKind kind, const ScheduleOptions& o, const SimulationResult& r) {
  ASSERT_EQ(static_cast<int>(r.timeline.size()), o.stages) << label(kind, o);
  const int chunks = o.stages * o.virtual_stages;
  auto end_of = [&](ActionKind k, int mb, int c) {
    for (const TimedAction& t : r.timeline[c % o.stages]) {
      if (t.action == Action{k, mb, c / o.stages}) return t.end;
    }
    ADD_FAILURE() << "pass missing from the timeline";
    return 0.0;
  };
  for (int s = 0; s < o.stages; ++s) {
    const std::vector<Action> schedule = make_schedule(kind, o, s);
    ASSERT_EQ(r.timeline[s].size(), schedule.size()) << label(kind, o);
    double free_at = 0;
    for (std::size_t i = 0; i < schedule.size(); ++i) {
      const TimedAction& t = r.timeline[s][i];
      EXPECT_EQ(t.action, schedule[i]) << label(kind, o);
      EXPECT_GE(t.start, free_at) << label(kind, o);
      free_at = t.end;
      const int c = model_chunk(o, s, t.action.chunk);
      if (t.action.kind == ActionKind::kForward) {
        if (c > 0) {
          EXPECT_GE(t.start, end_of(ActionKind::kForward, t.action.microbatch, c - 1));
        }
      } else {
        EXPECT_GE(t.start, end_of(ActionKind::kForward, t.action.microbatch, c));
        if (c + 1 < chunks) {
          EXPECT_GE(t.start, end_of(ActionKind::kBackward, t.action.microbatch, c + 1));
        }
      }
    }
    EXPECT_LE(free_at, r.makespan);
  }
}

TEST(Simulate, GpipeAndOneFOneBReachTheFormulaExactly) {
  for (ScheduleKind kind : {ScheduleKind::kGpipe, ScheduleKind::kOneFOneB}) {
    for (int p : {1, 2, 4}) {
      for (int m : {1, p - 1, p, 2 * p + 1}) {
        if (m < 1) continue;
        const ScheduleOptions o{p, m, 1};
        const SimulationResult r = simulate(kind, o, {1.0, 2.0});
        expect_consistent(kind, o, r);
        // (m + p - 1) slots of forward + backward; integer costs make both
        // sides the correctly rounded same ratio, so equality is exact.
        EXPECT_EQ(r.makespan, 3.0 * (m + p - 1)) << label(kind, o);
        EXPECT_EQ(r.bubble, theoretical_bubble(kind, o)) << label(kind, o);
        for (int s = 0; s < p; ++s) {
          EXPECT_EQ(r.peak_in_flight[s], kind == ScheduleKind::kGpipe ? m : std::min(p - s, m)) << label(kind, o);
        }
      }
    }
  }
}

// Interleaved: no deadlock on the grid, a smaller bubble than 1F1B on the
// same p and m, and the paper's (p-1)/(v*m+p-1). With uniform costs and free
// sends the simulation reaches the formula itself; the tolerance 1e-9 only
// covers float rounding of the per-chunk costs 1/v and 2/v (v = 3 is not
// exact in binary; measured differences are ~1e-16). A schedule without
// interleaving's gain misses it by > 0.09 (1F1B's bubble, printed beside it).
TEST(Simulate, InterleavedBeatsOneFOneBAndIsCloseToTheFormula) {
  constexpr double kTolerance = 1e-9;
  for (int p : {1, 2, 4}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p}) {
        const ScheduleOptions o{p, m, v};
        const SimulationResult r = simulate(ScheduleKind::kInterleaved1F1B, o, {1.0, 2.0});
        expect_consistent(ScheduleKind::kInterleaved1F1B, o, r);
        const double formula = theoretical_bubble(ScheduleKind::kInterleaved1F1B, o);
        const double one_f_one_b = simulate(ScheduleKind::kOneFOneB, {p, m, 1}, {1.0, 2.0}).bubble;
        std::printf("%s: simulated bubble %.6f, formula %.6f (diff %.1e), 1f1b %.6f\n",
                    label(ScheduleKind::kInterleaved1F1B, o).c_str(), r.bubble, formula, r.bubble - formula,
                    one_f_one_b);
        if (p > 1) {
          EXPECT_LT(r.bubble, one_f_one_b) << label(ScheduleKind::kInterleaved1F1B, o);
        }
        EXPECT_NEAR(r.bubble, formula, kTolerance) << label(ScheduleKind::kInterleaved1F1B, o);
      }
    }
  }
}

std::string deadlock_message(const std::vector<std::vector<Action>>& schedules, const ScheduleOptions& o) {
  try {
    simulate_schedules(schedules, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Negative control 1: stage 1 of a 2-stage 1F1B runs its backwards before its
// forwards. Every action is present once, so only the order is wrong.
TEST(Simulate, BackwardsBeforeForwardsDeadlock) {
  const ScheduleOptions o{2, 2, 1};
  const std::string msg = deadlock_message({one_f_one_b_schedule(o, 0), {B(0), B(1), F(0), F(1)}}, o);
  EXPECT_NE(msg.find("deadlocked"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 1 at action 0 B(mb 0, chunk 0)"), std::string::npos) << msg;
  // The same stages with their real schedules run.
  EXPECT_NO_THROW(simulate_schedules({one_f_one_b_schedule(o, 0), one_f_one_b_schedule(o, 1)}, o));
}

// Negative control 2: each stage's list is legal on its own (verify_schedule
// accepts it) but together they wait on each other: stage 0 skips its 1F1B
// warm-up and waits for B(0) while stage 1, in GPipe order, first wants F(1).
TEST(Simulate, CrossStageDeadlockIsNamed) {
  const ScheduleOptions o{2, 2, 1};
  const std::vector<Action> no_warmup = {F(0), B(0), F(1), B(1)};
  EXPECT_NO_THROW(verify_schedule(no_warmup, o, 0));
  const std::string msg = deadlock_message({no_warmup, gpipe_schedule(o, 1)}, o);
  EXPECT_NE(msg.find("deadlocked"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage 0 at action 1 B(mb 0, chunk 0) waits for B(mb 0, model chunk 1)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("stage 1 at action 1 F(mb 1, chunk 0) waits for F(mb 1, model chunk 0)"), std::string::npos)
      << msg;
  // With its warm-up, stage 0 works against a GPipe-ordered stage 1.
  EXPECT_NO_THROW(simulate_schedules({one_f_one_b_schedule(o, 0), gpipe_schedule(o, 1)}, o));
}

// Negative control 3: interleaved chunk order reversed on stage 0 (backward of
// chunk 0 = model chunk 0 before chunk 1 = model chunk 2) cannot run.
TEST(Simulate, InterleavedWrongChunkOrderDeadlocks) {
  const ScheduleOptions o{2, 2, 2};
  std::vector<Action> stage0 = interleaved_1f1b_schedule(o, 0);
  for (Action& a : stage0) {
    if (a.kind == ActionKind::kBackward) a.chunk = 1 - a.chunk;
  }
  const std::string msg = deadlock_message({stage0, interleaved_1f1b_schedule(o, 1)}, o);
  EXPECT_NE(msg.find("deadlocked"), std::string::npos) << msg;
  EXPECT_NO_THROW(simulate(ScheduleKind::kInterleaved1F1B, o));
}

// Beyond the grid: no schedule deadlocks for any p <= 8 and m <= 3p
// (interleaved: m a multiple of p up to 4p, v <= 4), costs uneven on purpose.
TEST(Simulate, NoDeadlockOnAWiderGrid) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p; ++m) {
      EXPECT_NO_THROW(simulate(ScheduleKind::kGpipe, {p, m, 1}, {1.0, 3.0})) << p << " " << m;
      EXPECT_NO_THROW(simulate(ScheduleKind::kOneFOneB, {p, m, 1}, {1.0, 3.0})) << p << " " << m;
    }
    for (int m = p; m <= 4 * p; m += p) {
      for (int v = 2; v <= 4; ++v) {
        EXPECT_NO_THROW(simulate(ScheduleKind::kInterleaved1F1B, {p, m, v}, {1.0, 3.0})) << p << " " << m << " " << v;
      }
    }
  }
}

TEST(Simulate, FormatTimeline) {
  const SimulationResult r = simulate(ScheduleKind::kOneFOneB, {2, 2, 1}, {1.0, 2.0});
  EXPECT_EQ(format_timeline(r), "stage 0: 01..aa.bb\nstage 1: .0aa1bb..\n");
  EXPECT_EQ(format_timeline(simulate(ScheduleKind::kGpipe, {2, 2, 1}, {1.0, 2.0})),
            "stage 0: 01...aabb\nstage 1: .01aabb..\n");
}

TEST(Simulate, IncompleteScheduleIsRejected) {
  const ScheduleOptions o{2, 2, 1};
  EXPECT_THROW(simulate_schedules({{F(0), B(0)}, one_f_one_b_schedule(o, 1)}, o), Error);
  EXPECT_THROW(simulate_schedules({one_f_one_b_schedule(o, 0)}, o), Error);
  EXPECT_THROW(simulate(ScheduleKind::kOneFOneB, o, {-1.0, 2.0}), c10::Error);
}

}  // namespace
}  // namespace paratrain::pipeline

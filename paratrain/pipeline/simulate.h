// A discrete-event simulation of pipeline schedules: every stage runs its
// action list strictly in order against the data dependencies between model
// chunks. Pure arithmetic, no tensors and no processes: it proves a schedule
// cannot deadlock and measures its bubble and activation peak before the
// executor runs it. Not a performance model of communication (sends are free).
#pragma once

#include <string>
#include <vector>

#include "paratrain/pipeline/schedule.h"

namespace paratrain::pipeline {

// Cost of one pass of one model chunk, in arbitrary time units.
// With interleaving a chunk is 1/v of a stage's layers, so simulate() scales
// both costs by 1/virtual_stages: a stage's useful work per micro-batch is then
// forward_cost + backward_cost for every schedule, and bubbles compare fairly.
struct SimulationOptions {
  // A forward pass of a whole stage (all its layers).
  double forward_cost = 1.0;
  // A backward pass of a whole stage: about twice the forward (gradients with
  // respect to both inputs and weights), the usual assumption in the papers.
  double backward_cost = 2.0;
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct SimulationResult {
  // Time at which the last stage's last action ends (all stages start at 0).
  double makespan = 0;
  // Idle share of the step: idle / (stages * makespan), where idle is every
  // stage's time not spent in an action, waits included.
  double bubble = 0;
  std::vector<std::vector<TimedAction>> timeline;  // per stage, in execution order
  std::vector<int> peak_in_flight;                 // per stage, see schedule.h
};

// Simulates make_schedule(kind, options, s) on every stage s. The
// dependencies, with model chunk c = chunk * stages + stage and C = stages * v:
//   F(mb, c) needs F(mb, c - 1) (for c > 0);
//   B(mb, c) needs F(mb, c) and B(mb, c + 1), or F(mb, C - 1) for c = C - 1.
// A stage starts its next action when it is free and the action's inputs
// exist; sends cost nothing and never block. Throws paratrain::Error naming
// every stuck stage and the action it waits at if the schedules deadlock.
SimulationResult simulate(ScheduleKind kind, const ScheduleOptions& options, const SimulationOptions& sim = {});

// The same on hand-written per-stage schedules (schedules.size() == stages),
// e.g. to show that a broken schedule deadlocks. Throws paratrain::Error if a
// stage's list is not exactly one forward and one backward of every
// (microbatch, chunk) (in any order: an order that cannot run is reported as
// the deadlock it causes).
SimulationResult simulate_schedules(const std::vector<std::vector<Action>>& schedules,
                                    const ScheduleOptions& options, const SimulationOptions& sim = {});

// One text row per stage for logs, docs and `plan`-style tools: each
// character is `unit` time; a forward of micro-batch mb shows as the digit
// mb % 10, a backward as the letter 'a' + mb % 26, idle time as '.'. E.g.
// 1F1B, p = 2, m = 2, costs 1 and 2:  "stage 0: 01..aa.bb" / "stage 1: .0aa1bb..".
std::string format_timeline(const SimulationResult& result, double unit = 1.0);

}  // namespace paratrain::pipeline

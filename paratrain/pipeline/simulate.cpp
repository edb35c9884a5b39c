// Discrete-event simulation of pipeline schedules (see simulate.h): the
// timeline is the longest-path schedule of the dependency graph formed by each
// stage's in-order list plus the cross-stage data edges.
#include "paratrain/pipeline/simulate.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "paratrain/core/error.h"

namespace paratrain::pipeline {

namespace {

// End times of every pass, indexed by (direction, microbatch, model chunk);
// unset until the pass has been simulated.
class Finished {
 public:
  Finished(int microbatches, int model_chunks)
      : chunks_(model_chunks), ends_(2 * static_cast<std::size_t>(microbatches) * model_chunks) {}
  std::optional<double>& at(ActionKind kind, int mb, int model_chunk) {
    const std::size_t dir = kind == ActionKind::kForward ? 0 : 1;
    return ends_[(dir * (ends_.size() / 2)) + static_cast<std::size_t>(mb) * chunks_ + model_chunk];
  }

 private:
  int chunks_;
  std::vector<std::optional<double>> ends_;
};

// The passes `action` on `stage` waits for (besides the stage's previous action).
struct Dependency {
  ActionKind kind;
  int microbatch;
  int model_chunk;
};
std::vector<Dependency> dependencies(const ScheduleOptions& options, int stage, const Action& a) {
  const int c = model_chunk(options, stage, a.chunk);
  const int last = options.stages * options.virtual_stages - 1;
  if (a.kind == ActionKind::kForward) {
    if (c == 0) return {};
    return {{ActionKind::kForward, a.microbatch, c - 1}};
  }
  if (c == last) return {{ActionKind::kForward, a.microbatch, c}};
  return {{ActionKind::kForward, a.microbatch, c}, {ActionKind::kBackward, a.microbatch, c + 1}};
}

std::string describe(const Dependency& d) {
  return fmt::format("{}(mb {}, model chunk {})", d.kind == ActionKind::kForward ? 'F' : 'B', d.microbatch,
                     d.model_chunk);
}

}  // namespace

SimulationResult simulate(ScheduleKind kind, const ScheduleOptions& options, const SimulationOptions& sim) {
  validate_schedule(kind, options);
  std::vector<std::vector<Action>> schedules;
  for (int s = 0; s < options.stages; ++s) schedules.push_back(make_schedule(kind, options, s));
  return simulate_schedules(schedules, options, sim);
}

SimulationResult simulate_schedules(const std::vector<std::vector<Action>>& schedules,
                                    const ScheduleOptions& options, const SimulationOptions& sim) {
  TORCH_CHECK(options.stages >= 1 && options.microbatches >= 1 && options.virtual_stages >= 1,
              "simulate_schedules: stages, microbatches and virtual_stages must be >= 1, got ", options.stages, ", ",
              options.microbatches, ", ", options.virtual_stages);
  TORCH_CHECK(std::isfinite(sim.forward_cost) && std::isfinite(sim.backward_cost) && sim.forward_cost >= 0 &&
                  sim.backward_cost >= 0,
              "simulate: forward_cost ", sim.forward_cost, " and backward_cost ", sim.backward_cost,
              " must be finite and >= 0");
  const int p = options.stages;
  if (static_cast<int>(schedules.size()) != p) {
    throw Error(fmt::format("pipeline simulation: {} schedules for {} stages", schedules.size(), p));
  }
  // Completeness only: the order is what the simulation itself judges.
  for (int s = 0; s < p; ++s) {
    std::vector<Action> forwards_first;
    for (const Action& a : schedules[s]) {
      if (a.kind == ActionKind::kForward) forwards_first.push_back(a);
    }
    for (const Action& a : schedules[s]) {
      if (a.kind == ActionKind::kBackward) forwards_first.push_back(a);
    }
    verify_schedule(forwards_first, options, s);
  }

  const double scale = 1.0 / options.virtual_stages;
  const double cost[2] = {sim.forward_cost * scale, sim.backward_cost * scale};
  Finished finished(options.microbatches, p * options.virtual_stages);
  SimulationResult result;
  result.timeline.resize(p);
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);

  // Sweep the stages, running every action whose inputs are finished, until
  // nothing moves. Each start time depends only on finished end times, so the
  // sweep order does not change the result: it is the earliest-start schedule.
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < schedules[s].size()) {
        const Action& a = schedules[s][next[s]];
        double ready = free_at[s];
        bool blocked = false;
        for (const Dependency& d : dependencies(options, s, a)) {
          const std::optional<double>& end = finished.at(d.kind, d.microbatch, d.model_chunk);
          if (!end) {
            blocked = true;
            break;
          }
          ready = std::max(ready, *end);
        }
        if (blocked) break;
        const double end = ready + cost[a.kind == ActionKind::kForward ? 0 : 1];
        finished.at(a.kind, a.microbatch, model_chunk(options, s, a.chunk)) = end;
        result.timeline[s].push_back({a, ready, end});
        free_at[s] = end;
        ++next[s];
        progressed = true;
      }
    }
  }

  std::vector<std::string> stuck;
  for (int s = 0; s < p; ++s) {
    if (next[s] == schedules[s].size()) continue;
    const Action& a = schedules[s][next[s]];
    std::string missing;
    for (const Dependency& d : dependencies(options, s, a)) {
      if (!finished.at(d.kind, d.microbatch, d.model_chunk)) missing += (missing.empty() ? "" : ", ") + describe(d);
    }
    stuck.push_back(fmt::format("stage {} at action {} {} waits for {}", s, next[s], to_string(a), missing));
  }
  if (!stuck.empty()) {
    throw Error(fmt::format("pipeline simulation deadlocked: {}; the schedules order passes so that each stuck "
                            "stage waits for another stuck one",
                            fmt::join(stuck, "; ")));
  }

  double busy = 0;
  for (int s = 0; s < p; ++s) {
    result.makespan = std::max(result.makespan, free_at[s]);
    for (const TimedAction& t : result.timeline[s]) busy += t.end - t.start;
    result.peak_in_flight.push_back(peak_in_flight(schedules[s]));
  }
  // idle / total rather than 1 - busy / total: with integer costs both terms
  // are exact, so the bubble is the correctly rounded ratio, bit-equal to the
  // formula's (p-1)/(m+p-1) when the schedule achieves it.
  const double total = p * result.makespan;
  result.bubble = total > 0 ? (total - busy) / total : 0.0;
  return result;
}

std::string format_timeline(const SimulationResult& result, double unit) {
  if (!(unit > 0)) throw Error(fmt::format("format_timeline: unit = {} must be > 0", unit));
  const auto cells = static_cast<std::size_t>(std::ceil(result.makespan / unit - 1e-9));
  std::string out;
  for (std::size_t s = 0; s < result.timeline.size(); ++s) {
    std::string row(cells, '.');
    for (const TimedAction& t : result.timeline[s]) {
      // A cell shows the action running at its midpoint.
      for (std::size_t i = 0; i < cells; ++i) {
        const double mid = (static_cast<double>(i) + 0.5) * unit;
        if (mid < t.start || mid >= t.end) continue;
        const int mb = t.action.microbatch;
        row[i] = static_cast<char>(t.action.kind == ActionKind::kForward ? '0' + mb % 10 : 'a' + mb % 26);
      }
    }
    out += fmt::format("stage {}: {}\n", s, row);
  }
  return out;
}

}  // namespace paratrain::pipeline

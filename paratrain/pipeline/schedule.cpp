// Schedule names, option checks, the dispatcher and the accounting shared by
// every schedule (peak activations, bubble formulas, completeness check). The
// schedules themselves live one per file in schedules/.
#include "paratrain/pipeline/schedule.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

#include "paratrain/core/error.h"

namespace paratrain::pipeline {

namespace {
constexpr const char* kAllowed = "gpipe, 1f1b, interleaved_1f1b";
}  // namespace

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGpipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved_1f1b") return ScheduleKind::kInterleaved1F1B;
  throw ConfigError(fmt::format("pipeline.schedule = \"{}\" is not a schedule; use one of: {}", name, kAllowed));
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGpipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved_1f1b";
  }
  TORCH_CHECK(false, "schedule_name: unknown ScheduleKind ", static_cast<int>(kind));
}

std::string to_string(const Action& action) {
  return fmt::format("{}(mb {}, chunk {})", action.kind == ActionKind::kForward ? 'F' : 'B', action.microbatch,
                     action.chunk);
}

void validate_schedule(ScheduleKind kind, const ScheduleOptions& options) {
  const std::string name = schedule_name(kind);
  if (options.stages < 1) {
    throw ConfigError(fmt::format("parallel.pp = {}: a pipeline needs at least 1 stage", options.stages));
  }
  if (options.microbatches < 1) {
    throw ConfigError(fmt::format("pipeline.microbatches = {}: needs at least 1 micro-batch", options.microbatches));
  }
  if (kind != ScheduleKind::kInterleaved1F1B) {
    if (options.virtual_stages != 1) {
      throw ConfigError(fmt::format(
          "pipeline.virtual_stages = {} with pipeline.schedule = \"{}\": only interleaved_1f1b runs several model "
          "chunks per stage; set pipeline.virtual_stages = 1 or pipeline.schedule = \"interleaved_1f1b\"",
          options.virtual_stages, name));
    }
    return;
  }
  if (options.virtual_stages < 2) {
    throw ConfigError(fmt::format(
        "pipeline.virtual_stages = {} with pipeline.schedule = \"interleaved_1f1b\": interleaving needs at least 2 "
        "model chunks per stage; set pipeline.virtual_stages >= 2 or use pipeline.schedule = \"1f1b\"",
        options.virtual_stages));
  }
  if (options.microbatches % options.stages != 0) {
    throw ConfigError(fmt::format(
        "pipeline.microbatches = {} is not a multiple of parallel.pp = {}: interleaved_1f1b sends micro-batches "
        "through the model chunks in groups of parallel.pp (as Megatron-LM does); use a multiple such as {}",
        options.microbatches, options.stages,
        (options.microbatches / options.stages + 1) * options.stages));
  }
}

void validate_stage(const ScheduleOptions& options, int stage) {
  TORCH_CHECK(stage >= 0 && stage < options.stages, "pipeline schedule: stage ", stage, " is outside 0..",
              options.stages - 1);
}

std::vector<Action> make_schedule(ScheduleKind kind, const ScheduleOptions& options, int stage) {
  switch (kind) {
    case ScheduleKind::kGpipe: return gpipe_schedule(options, stage);
    case ScheduleKind::kOneFOneB: return one_f_one_b_schedule(options, stage);
    case ScheduleKind::kInterleaved1F1B: return interleaved_1f1b_schedule(options, stage);
  }
  TORCH_CHECK(false, "make_schedule: unknown ScheduleKind ", static_cast<int>(kind));
}

void verify_schedule(const std::vector<Action>& actions, const ScheduleOptions& options, int stage) {
  const auto fail = [&](std::size_t index, const std::string& what) {
    throw Error(fmt::format("pipeline schedule of stage {}: action {} {}: {}", stage, index,
                            to_string(actions[index]), what));
  };
  std::set<std::pair<int, int>> forwarded;
  std::set<std::pair<int, int>> backwarded;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.microbatch < 0 || a.microbatch >= options.microbatches || a.chunk < 0 || a.chunk >= options.virtual_stages) {
      fail(i, fmt::format("outside {} micro-batches x {} chunks", options.microbatches, options.virtual_stages));
    }
    const std::pair<int, int> key{a.microbatch, a.chunk};
    if (a.kind == ActionKind::kForward) {
      if (!forwarded.insert(key).second) fail(i, "forward runs twice");
    } else {
      if (!forwarded.count(key)) fail(i, "backward before its forward");
      if (!backwarded.insert(key).second) fail(i, "backward runs twice");
    }
  }
  const std::size_t expected = static_cast<std::size_t>(options.microbatches) * options.virtual_stages;
  if (forwarded.size() != expected || backwarded.size() != expected) {
    throw Error(fmt::format("pipeline schedule of stage {}: {} forwards and {} backwards, expected {} of each "
                            "({} micro-batches x {} chunks)",
                            stage, forwarded.size(), backwarded.size(), expected, options.microbatches,
                            options.virtual_stages));
  }
}

int peak_in_flight(const std::vector<Action>& actions) {
  int alive = 0;
  int peak = 0;
  for (const Action& a : actions) {
    alive += a.kind == ActionKind::kForward ? 1 : -1;
    peak = std::max(peak, alive);
  }
  return peak;
}

double theoretical_bubble(ScheduleKind kind, const ScheduleOptions& options) {
  validate_schedule(kind, options);
  const double p = options.stages;
  const double m = options.microbatches;
  const double v = kind == ScheduleKind::kInterleaved1F1B ? options.virtual_stages : 1;
  // Fill and drain cost (p-1) passes of a stage; interleaving makes each pass a
  // chunk of 1/v of the layers while the useful work stays v*m chunk passes.
  return (p - 1) / (v * m + p - 1);
}

}  // namespace paratrain::pipeline

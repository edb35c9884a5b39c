// The schema rows and cross-key rules of [profile] (profile_section.h).
#include "paratrain/train/config/profile_section.h"

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train {

namespace {

// "N" or "A-B" with 1 <= A <= B; nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> parse_steps(const std::string& text) {
  auto number = [](const std::string& s) -> std::optional<int64_t> {
    if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return std::stoll(s);
  };
  const auto dash = text.find('-');
  const auto first = number(dash == std::string::npos ? text : text.substr(0, dash));
  const auto last = dash == std::string::npos ? first : number(text.substr(dash + 1));
  if (!first || !last || *first < 1 || *last < *first) return std::nullopt;
  return std::make_pair(*first, *last);
}

}  // namespace

std::optional<std::pair<int64_t, int64_t>> profile_step_range(const ProfileConfig& profile) {
  if (profile.steps.empty()) return std::nullopt;
  return parse_steps(profile.steps);
}

namespace detail {

std::vector<FieldSpec> profile_fields() {
  using TC = TrainConfig;
  const Check<std::string> step_range = [](const std::string& v) -> std::string {
    if (v.empty() || parse_steps(v)) return "";
    return "must be \"\" (off), a step \"N\" or a range \"A-B\" of optimizer steps with 1 <= A <= B, e.g. \"10-12\"";
  };
  const Check<std::vector<int64_t>> rank_list = [](const std::vector<int64_t>& v) -> std::string {
    for (int64_t r : v)
      if (r < 0 || r >= kMaxRanks) return fmt::format("every rank must be in [0, {})", kMaxRanks);
    return "";
  };
  FieldSpec ranks = field("profile.ranks", &TC::profile, &ProfileConfig::ranks, "ranks that record: \"all\" (or []) or a list, e.g. [0, 3]; the others only align clocks", rank_list);
  ranks.keyword = "all";
  ranks.keyword_value = std::vector<int64_t>{};
  return {
      field("profile.steps", &TC::profile, &ProfileConfig::steps, "optimizer steps to profile: \"\" (off, no cost), \"N\" or \"A-B\" (1 = the first step); writes <run_dir>/profile/rank_<r>.json for `paratrain trace` and `paratrain profile`", step_range),
      ranks,
      field("profile.record_shapes", &TC::profile, &ProfileConfig::record_shapes, "record every operator's input shapes (shown in the trace; more overhead)"),
      field("profile.memory", &TC::profile, &ProfileConfig::memory, "record allocations and frees: an allocated-bytes counter per rank in the trace"),
      field("profile.test_slow_rank", &TC::profile, &ProfileConfig::test_slow_rank, "experiments and tests: a straggler on purpose (-1 = none): it sleeps profile.test_slow_ms before each step's first forward, and/or computes profile.test_slow_factor times slower per example", in_range<int64_t>(-1, kMaxRanks)),
      field("profile.test_slow_ms", &TC::profile, &ProfileConfig::test_slow_ms, "experiments and tests: the straggler's sleep per step (ms)", in_range_finite(0.0, 3600e3)),
      field("profile.test_example_ms", &TC::profile, &ProfileConfig::test_example_ms, "experiments and tests: every rank sleeps this long per example of a micro-batch (ms; test_slow_rank test_slow_factor times as long), a compute cost linear in the batch; 0 = off", in_range_finite(0.0, 1000.0)),
      field("profile.test_slow_factor", &TC::profile, &ProfileConfig::test_slow_factor, "experiments and tests: the straggler computes this many times slower per example (it sleeps factor - 1 times each micro-batch's compute; 1 = off)", in_range_finite(1.0, 1000.0)),
  };
}

std::string profile_problem(const TrainConfig& c) {
  const ProfileConfig& p = c.profile;
  const bool slowed = p.test_slow_ms > 0 || p.test_slow_factor > 1;
  if ((p.test_slow_rank >= 0) != slowed)
    return fmt::format("profile.test_slow_rank = {} with profile.test_slow_ms = {} and profile.test_slow_factor = {}: "
                       "set a rank and its delay (test_slow_ms per step or test_slow_factor per example) or neither",
                       p.test_slow_rank, p.test_slow_ms, p.test_slow_factor);
  if (p.steps.empty() && (!p.ranks.empty() || p.record_shapes || p.memory))
    return "profile.ranks, profile.record_shapes and profile.memory apply to a profiled step range: set "
           "profile.steps (e.g. \"10-12\"), or leave them at their defaults";
  return "";
}

}  // namespace detail
}  // namespace paratrain::train

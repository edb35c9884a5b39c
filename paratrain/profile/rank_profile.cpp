// RankProfile's file format: see rank_profile.h.
#include "paratrain/profile/rank_profile.h"

#include <algorithm>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"

namespace paratrain::profile {
namespace {

constexpr int kFormatVersion = 1;

nlohmann::json event_json(const OpEvent& e) {
  nlohmann::json j = {{"name", e.name}, {"ts", e.start_us}, {"dur", e.dur_us}, {"thread", e.thread}};
  if (e.user_scope) j["user_scope"] = true;
  if (e.gpu) {
    j["gpu"] = true;
    j["stream"] = e.stream;
  }
  if (e.bytes != 0) j["bytes"] = e.bytes;
  if (!e.shapes.empty()) j["shapes"] = e.shapes;
  return j;
}

OpEvent event_from(const nlohmann::json& j) {
  OpEvent e;
  e.name = j.at("name").get<std::string>();
  e.start_us = j.at("ts").get<int64_t>();
  e.dur_us = j.at("dur").get<int64_t>();
  e.thread = j.at("thread").get<uint64_t>();
  e.user_scope = j.value("user_scope", false);
  e.gpu = j.value("gpu", false);
  e.stream = j.value("stream", int64_t{0});
  e.bytes = j.value("bytes", int64_t{0});
  e.shapes = j.value("shapes", std::string());
  return e;
}

}  // namespace

nlohmann::json to_json(const RankProfile& p) {
  nlohmann::json steps = nlohmann::json::array(), events = nlohmann::json::array(),
                 comms = nlohmann::json::array();
  for (const auto& s : p.steps) steps.push_back({{"step", s.step}, {"start", s.start_us}, {"end", s.end_us}});
  for (const auto& e : p.events) events.push_back(event_json(e));
  for (const auto& c : p.collectives)
    comms.push_back({{"op", c.op}, {"group", c.group}, {"seq", c.seq}, {"bytes", c.bytes}, {"dtype", c.dtype},
                     {"peer", c.peer}, {"start", c.start_us}, {"end", c.end_us}, {"state", c.state}});
  return {{"format", "paratrain-profile"},
          {"version", kFormatVersion},
          {"rank", p.rank},
          {"world_size", p.world_size},
          {"host", p.host},
          {"profiler", p.profiler},
          {"loop_thread", p.loop_thread},
          {"clock",
           {{"method", p.clock.method}, {"offset_us", p.clock.offset_us}, {"skew_us", p.clock.skew_us},
            {"steady_to_system_us", p.clock.steady_to_system_us}}},
          {"overhead",
           {{"profiled_step_ms", p.overhead.profiled_step_ms},
            {"unprofiled_step_ms", p.overhead.unprofiled_step_ms},
            {"unprofiled_steps", p.overhead.unprofiled_steps}}},
          {"collectives_source", p.collectives_source},
          {"dropped_collectives", p.dropped_collectives},
          {"steps", std::move(steps)},
          {"collectives", std::move(comms)},
          {"events", std::move(events)}};
}

RankProfile rank_profile_from_json(const nlohmann::json& j, const std::string& source) {
  try {
    if (j.value("format", std::string()) != "paratrain-profile")
      throw ConfigError(fmt::format("{} is not a paratrain profile (no \"format\": \"paratrain-profile\")", source));
    if (j.at("version").get<int>() > kFormatVersion)
      throw ConfigError(fmt::format("{} has profile format version {}; this paratrain reads up to {}: update it",
                                    source, j.at("version").get<int>(), kFormatVersion));
    RankProfile p;
    p.rank = j.at("rank").get<int>();
    p.world_size = j.at("world_size").get<int>();
    p.host = j.at("host").get<std::string>();
    p.profiler = j.at("profiler").get<std::string>();
    p.loop_thread = j.at("loop_thread").get<uint64_t>();
    const auto& c = j.at("clock");
    p.clock = {c.at("method").get<std::string>(), c.at("offset_us").get<int64_t>(), c.at("skew_us").get<int64_t>(),
               c.at("steady_to_system_us").get<int64_t>()};
    const auto& o = j.at("overhead");
    p.overhead = {o.at("profiled_step_ms").get<double>(), o.at("unprofiled_step_ms").get<double>(),
                  o.at("unprofiled_steps").get<int64_t>()};
    p.collectives_source = j.at("collectives_source").get<std::string>();
    p.dropped_collectives = j.at("dropped_collectives").get<int64_t>();
    for (const auto& s : j.at("steps"))
      p.steps.push_back({s.at("step").get<int64_t>(), s.at("start").get<int64_t>(), s.at("end").get<int64_t>()});
    for (const auto& x : j.at("collectives"))
      p.collectives.push_back({x.at("op").get<std::string>(), x.at("group").get<std::string>(),
                               x.at("seq").get<int64_t>(), x.at("bytes").get<int64_t>(),
                               x.at("dtype").get<std::string>(), x.at("peer").get<int>(),
                               x.at("start").get<int64_t>(), x.at("end").get<int64_t>(),
                               x.at("state").get<std::string>()});
    for (const auto& e : j.at("events")) p.events.push_back(event_from(e));
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{} is not a valid paratrain profile: {}", source, e.what()));
  }
}

std::filesystem::path profile_dir(const std::filesystem::path& run_dir) { return run_dir / "profile"; }

void write_rank_profile(const std::filesystem::path& dir, const RankProfile& profile) {
  std::filesystem::create_directories(dir);
  write_file_atomically(dir / fmt::format("rank_{}.json", profile.rank), to_json(profile).dump());
}

std::vector<RankProfile> read_run_profiles(const std::filesystem::path& run_dir) {
  const auto dir = profile_dir(run_dir);
  std::vector<RankProfile> out;
  std::error_code ec;
  static const std::regex name("rank_[0-9]+\\.json");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!std::regex_match(entry.path().filename().string(), name)) continue;
    std::ifstream in(entry.path());
    nlohmann::json j;
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("{} is not valid JSON ({}): was it cut short?", entry.path().string(), e.what()));
    }
    out.push_back(rank_profile_from_json(j, entry.path().string()));
  }
  if (out.empty())
    throw ConfigError(fmt::format("no profile in {} (no {}/rank_<r>.json): record one with `paratrain train ... "
                                  "--set profile.steps=10-12`",
                                  run_dir.string(), dir.string()));
  std::sort(out.begin(), out.end(), [](const RankProfile& a, const RankProfile& b) { return a.rank < b.rank; });
  return out;
}

}  // namespace paratrain::profile

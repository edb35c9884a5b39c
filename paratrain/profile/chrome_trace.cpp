// chrome_trace: see chrome_trace.h.
#include "paratrain/profile/chrome_trace.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace paratrain::profile {
namespace {

// Thread ids within a rank's process.
constexpr int64_t kStepsTid = 1;
constexpr int64_t kLoopTid = 2;
constexpr int64_t kOtherThreadTid = 100;   // + the profiler's thread id
constexpr int64_t kCommTid = 10000;        // + the group's index
constexpr int64_t kGpuTid = 20000;         // + the stream

nlohmann::json meta(const char* what, int pid, int64_t tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

nlohmann::json sort_index(int pid, int64_t tid, int64_t index) {
  return {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"sort_index", index}}}};
}

void add_rank(const RankProfile& p, int64_t origin, nlohmann::json& events) {
  const int pid = p.rank;
  events.push_back(meta("process_name", pid, 0, fmt::format("rank {} ({})", p.rank, p.host)));
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", p.rank}}}});
  events.push_back(meta("thread_name", pid, kStepsTid, "steps"));
  events.push_back(sort_index(pid, kStepsTid, 0));
  events.push_back(meta("thread_name", pid, kLoopTid, "training loop (compute)"));
  events.push_back(sort_index(pid, kLoopTid, 1));
  for (const auto& s : p.steps)
    events.push_back({{"name", fmt::format("step {}", s.step)}, {"ph", "X"}, {"pid", pid}, {"tid", kStepsTid},
                      {"ts", s.start_us - origin}, {"dur", s.end_us - s.start_us}, {"cat", "step"},
                      {"args", {{"step", s.step}}}});
  std::set<uint64_t> other_threads;
  std::set<int64_t> streams;
  int64_t allocated = 0;
  for (const auto& e : p.events) {
    if (e.name == "[memory]") {
      allocated += e.bytes;
      events.push_back({{"name", "allocated bytes"}, {"ph", "C"}, {"pid", pid}, {"tid", 0}, {"ts", e.start_us - origin},
                        {"args", {{"bytes", allocated}}}});
      continue;
    }
    int64_t tid = kLoopTid;
    if (e.gpu) {
      tid = kGpuTid + e.stream;
      streams.insert(e.stream);
    } else if (e.thread != p.loop_thread) {
      tid = kOtherThreadTid + static_cast<int64_t>(e.thread);
      other_threads.insert(e.thread);
    }
    nlohmann::json args = nlohmann::json::object();
    if (!e.shapes.empty()) args["shapes"] = e.shapes;
    events.push_back({{"name", e.name}, {"ph", "X"}, {"pid", pid}, {"tid", tid}, {"ts", e.start_us - origin},
                      {"dur", e.dur_us}, {"cat", e.user_scope ? "phase" : (e.gpu ? "gpu" : "op")}, {"args", args}});
  }
  for (uint64_t t : other_threads) {
    events.push_back(meta("thread_name", pid, kOtherThreadTid + static_cast<int64_t>(t),
                          fmt::format("LibTorch thread {} (autograd, intra-op, data loading)", t)));
    events.push_back(sort_index(pid, kOtherThreadTid + static_cast<int64_t>(t), 3));
  }
  for (int64_t stream : streams) events.push_back(meta("thread_name", pid, kGpuTid + stream, fmt::format("GPU stream {}", stream)));
  std::map<std::string, int64_t> groups;
  for (const auto& c : p.collectives) {
    auto [it, fresh] = groups.emplace(c.group, static_cast<int64_t>(groups.size()));
    const int64_t tid = kCommTid + it->second;
    if (fresh) {
      events.push_back(meta("thread_name", pid, tid, fmt::format("communication: {}", c.group)));
      events.push_back(sort_index(pid, tid, 2));
    }
    events.push_back({{"name", c.op}, {"ph", "X"}, {"pid", pid}, {"tid", tid}, {"ts", c.start_us - origin},
                      {"dur", std::max<int64_t>(0, c.end_us - c.start_us)}, {"cat", "collective"},
                      {"args", {{"group", c.group}, {"seq", c.seq}, {"bytes", c.bytes}, {"dtype", c.dtype},
                                {"peer", c.peer}, {"state", c.state}}}});
  }
}

}  // namespace

nlohmann::json chrome_trace(const std::vector<RankProfile>& ranks) {
  int64_t origin = INT64_MAX;
  for (const auto& p : ranks)
    for (const auto& s : p.steps) origin = std::min(origin, s.start_us);
  if (origin == INT64_MAX) origin = 0;
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json clocks = nlohmann::json::array();
  for (const auto& p : ranks) {
    add_rank(p, origin, events);
    clocks.push_back({{"rank", p.rank}, {"method", p.clock.method}, {"offset_us", p.clock.offset_us},
                      {"skew_us", p.clock.skew_us}, {"profiler", p.profiler}});
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"source", "paratrain profile"}, {"origin_unix_us", origin}, {"ranks", std::move(clocks)}}}};
}

std::string trace_event_format_problem(const nlohmann::json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    return "the document is not an object with a \"traceEvents\" array";
  static const std::set<std::string> phases = {"B", "E", "X", "i", "I", "C", "M", "b", "e", "n", "s", "t", "f", "P", "O", "N", "D"};
  size_t i = 0;
  for (const auto& e : trace["traceEvents"]) {
    auto where = [&](const std::string& what) { return fmt::format("event {}: {}", i, what); };
    if (!e.is_object()) return where("not an object");
    if (!e.contains("name") || !e["name"].is_string()) return where("no string \"name\"");
    if (!e.contains("ph") || !e["ph"].is_string() || !phases.count(e["ph"].get<std::string>()))
      return where("no known \"ph\"");
    const std::string ph = e["ph"];
    if (!e.contains("pid") || !e["pid"].is_number_integer()) return where("no integer \"pid\"");
    if (!e.contains("tid") || !e["tid"].is_number_integer()) return where("no integer \"tid\"");
    if (ph != "M" && (!e.contains("ts") || !e["ts"].is_number())) return where("no numeric \"ts\"");
    if (ph == "X" && (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0))
      return where("a complete event (\"X\") without a non-negative \"dur\"");
    if (e.contains("args") && !e["args"].is_object()) return where("\"args\" is not an object");
    ++i;
  }
  return "";
}

}  // namespace paratrain::profile

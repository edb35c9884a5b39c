// Timeline recording, the rank files' JSONL format (written and read back
// strictly), and the measured bubble. The Chrome trace built from these
// files is chrome_trace.cpp.
#include "paratrain/pipeline/timeline.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <system_error>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"

namespace paratrain::pipeline {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr EventKind kAllKinds[] = {EventKind::kForward, EventKind::kBackward, EventKind::kRecompute,
                                   EventKind::kSend,    EventKind::kRecv,     EventKind::kWait,
                                   EventKind::kOptimizer};

bool is_compute(EventKind kind) {
  return kind == EventKind::kForward || kind == EventKind::kBackward || kind == EventKind::kRecompute;
}

json event_to_json(const TimelineEvent& e) {
  return json{{"kind", to_string(e.kind)}, {"step", e.step},   {"mb", e.microbatch},   {"chunk", e.chunk},
              {"peer", e.peer},            {"bytes", e.bytes}, {"start_us", e.start_us}, {"end_us", e.end_us}};
}

// Parsing one line; the caller adds the file and line to the message.
struct LineError {
  std::string what;
};

int64_t integer_field(const json& j, const char* key, bool required, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw LineError{fmt::format("missing \"{}\"", key)};
    return fallback;
  }
  if (!it->is_number_integer()) throw LineError{fmt::format("\"{}\" is {}, expected an integer", key, it->dump())};
  return it->get<int64_t>();
}

EventKind kind_from_string(const std::string& s) {
  for (auto kind : kAllKinds) {
    if (to_string(kind) == s) return kind;
  }
  throw LineError{fmt::format("unknown kind \"{}\" (expected forward, backward, recompute, send, recv, wait or "
                              "optimizer)",
                              s)};
}

TimelineEvent event_from_json(const json& j) {
  auto kind = j.find("kind");
  if (!kind->is_string()) throw LineError{fmt::format("\"kind\" is {}, expected a string", kind->dump())};
  TimelineEvent e;
  e.kind = kind_from_string(kind->get<std::string>());
  e.step = integer_field(j, "step", true, 0);
  e.microbatch = static_cast<int>(integer_field(j, "mb", false, -1));
  e.chunk = static_cast<int>(integer_field(j, "chunk", false, -1));
  e.peer = static_cast<int>(integer_field(j, "peer", false, -1));
  e.bytes = integer_field(j, "bytes", false, 0);
  e.start_us = integer_field(j, "start_us", true, 0);
  e.end_us = integer_field(j, "end_us", true, 0);
  if (e.end_us < e.start_us) {
    throw LineError{fmt::format("end_us {} is before start_us {}", e.end_us, e.start_us)};
  }
  return e;
}

TimelineHeader header_from_json(const json& j) {
  TimelineHeader h;
  h.rank = static_cast<int>(integer_field(j, "rank", true, -1));
  h.stage = static_cast<int>(integer_field(j, "stage", false, -1));
  h.dp = static_cast<int>(integer_field(j, "dp", false, -1));
  return h;
}

}  // namespace

std::string to_string(EventKind kind) {
  switch (kind) {
    case EventKind::kForward: return "forward";
    case EventKind::kBackward: return "backward";
    case EventKind::kRecompute: return "recompute";
    case EventKind::kSend: return "send";
    case EventKind::kRecv: return "recv";
    case EventKind::kWait: return "wait";
    case EventKind::kOptimizer: return "optimizer";
  }
  TORCH_CHECK(false, "unknown EventKind ", static_cast<int>(kind));
}

// ---- recording

Timeline::Timeline(int rank, TimelineOptions options)
    : header_{rank, options.stage, options.dp}, options_(std::move(options)) {
  TORCH_CHECK(rank >= 0, "Timeline: rank must be >= 0, got ", rank);
  TORCH_CHECK(options_.max_steps >= 0, "Timeline: max_steps must be >= 0, got ", options_.max_steps);
}

Timeline::~Timeline() {
  if (out_.is_open()) out_.flush();
}

int64_t Timeline::now_us() {
  // steady_clock is CLOCK_MONOTONIC in libstdc++ and libc++ on Linux: shared
  // by the processes of one machine (see TimelineEvent).
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool Timeline::recording(int64_t step) const {
  if (options_.max_steps == 0) return false;
  if (first_step_ < 0) return true;
  return step >= first_step_ && step < first_step_ + options_.max_steps;
}

void Timeline::record(const TimelineEvent& e) {
  if (!recording(e.step)) return;
  if (first_step_ < 0) {
    first_step_ = e.step;
    if (!options_.path.empty()) {
      std::error_code ec;  // a failure shows as a closed stream, reported by end_step
      fs::create_directories(options_.path.parent_path(), ec);
      out_.open(options_.path, std::ios::out | std::ios::trunc);
      out_ << json{{"rank", header_.rank}, {"stage", header_.stage}, {"dp", header_.dp}}.dump() << '\n';
    }
  }
  events_.push_back(e);
  if (!options_.path.empty()) out_ << event_to_json(e).dump() << '\n';
}

void Timeline::end_step(int64_t /*step*/) {
  if (options_.path.empty() || first_step_ < 0) return;
  out_.flush();
  if (!out_) {
    throw Error(fmt::format("rank {}: could not write the pipeline timeline {} (is the disk full or the folder "
                            "read-only?); set pipeline.trace_steps = 0 to run without it",
                            header_.rank, options_.path.string()));
  }
}

Timeline::Scope::Scope(Timeline* timeline, const TimelineEvent& event)
    : timeline_(timeline != nullptr && timeline->recording(event.step) ? timeline : nullptr), event_(event) {
  if (timeline_ != nullptr) event_.start_us = now_us();
}

Timeline::Scope::~Scope() {
  if (timeline_ == nullptr) return;
  event_.end_us = now_us();
  timeline_->record(event_);
}

// ---- the rank files

fs::path timeline_path(const fs::path& run_dir, int rank) {
  return run_dir / "trace" / fmt::format("rank_{}.jsonl", rank);
}

RankTimeline read_rank_timeline(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open the pipeline timeline {}", file.string()));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  RankTimeline result;
  bool seen_any = false;
  size_t begin = 0;
  for (int line_no = 1; begin < text.size(); ++line_no) {
    const size_t newline = text.find('\n', begin);
    const bool last_unterminated = newline == std::string::npos;
    const std::string line = text.substr(begin, last_unterminated ? std::string::npos : newline - begin);
    begin = last_unterminated ? text.size() : newline + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        if (last_unterminated) break;  // a write cut short by a crash (see the header)
        throw LineError{"not valid JSON"};
      }
      if (!j.is_object()) throw LineError{"not a JSON object"};
      if (!j.contains("kind")) {
        if (seen_any || !j.contains("rank")) throw LineError{"neither an event (no \"kind\") nor the first-line header"};
        result.header = header_from_json(j);
      } else {
        result.events.push_back(event_from_json(j));
      }
      seen_any = true;
    } catch (const LineError& e) {
      throw Error(fmt::format("{}:{}: {}; this file is written by paratrain's pipeline Timeline, one JSON object "
                              "per line (delete it, or rerun to write it again)",
                              file.string(), line_no, e.what));
    }
  }
  return result;
}

std::vector<TimelineEvent> read_timeline(const fs::path& file) { return read_rank_timeline(file).events; }

std::vector<RankTimeline> read_run_timelines(const fs::path& run_dir) {
  const fs::path dir = run_dir / "trace";
  std::map<int, fs::path> files;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    static const std::regex kName(R"(rank_(\d+)\.jsonl)");
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::smatch m;
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && std::regex_match(name, m, kName)) files[std::stoi(m[1].str())] = entry.path();
    }
  }
  if (files.empty()) {
    throw Error(fmt::format("no pipeline timeline in {}: expected {}/rank_<r>.jsonl files. They are written by a "
                            "run with a pipeline strategy (parallel.pp > 1) and pipeline.trace_steps > 0, e.g. "
                            "`paratrain train --config job.toml --set pipeline.trace_steps=5` under launch",
                            run_dir.string(), dir.string()));
  }
  std::vector<RankTimeline> result;
  for (const auto& [rank, path] : files) {
    auto timeline = read_rank_timeline(path);
    if (timeline.header.rank == -1) timeline.header.rank = rank;
    if (timeline.header.rank != rank) {
      throw Error(fmt::format("{}: the header says rank {} but the file name says rank {}; the trace folder mixes "
                              "files of different runs (delete it and rerun)",
                              path.string(), timeline.header.rank, rank));
    }
    result.push_back(std::move(timeline));
  }
  return result;
}

// ---- the measured bubble

BubbleReport measure_bubble(const std::vector<std::vector<TimelineEvent>>& per_rank, int64_t step) {
  // The span starts at the step's first compute, not its first event: a rank
  // done with the previous step posts its first receive of this one while
  // earlier stages still run the previous step's backward, so event-bounded
  // spans of back-to-back steps overlap and count that wait in both.
  int64_t first = 0, first_compute = 0, last = 0;
  bool any = false, any_compute = false;
  std::vector<double> busy(per_rank.size(), 0.0);
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (const auto& e : per_rank[r]) {
      if (e.step != step) continue;
      first = any ? std::min(first, e.start_us) : e.start_us;
      last = any ? std::max(last, e.end_us) : e.end_us;
      any = true;
      // One thread per rank runs compute, so compute events never overlap
      // and their durations add up to the busy time.
      if (is_compute(e.kind)) {
        busy[r] += static_cast<double>(e.end_us - e.start_us);
        first_compute = any_compute ? std::min(first_compute, e.start_us) : e.start_us;
        any_compute = true;
      }
    }
  }
  if (any_compute) first = first_compute;
  if (!any) throw Error(fmt::format("measure_bubble: no rank recorded an event of step {}", step));
  BubbleReport report;
  report.step = step;
  report.span_us = static_cast<double>(last - first);
  report.idle_share.assign(per_rank.size(), 0.0);
  if (report.span_us <= 0 || per_rank.empty()) return report;
  double sum = 0;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    report.idle_share[r] = 1.0 - busy[r] / report.span_us;
    sum += report.idle_share[r];
  }
  report.bubble = sum / static_cast<double>(per_rank.size());
  return report;
}

std::vector<int64_t> recorded_steps(const std::vector<std::vector<TimelineEvent>>& per_rank) {
  std::set<int64_t> steps;
  for (const auto& events : per_rank) {
    for (const auto& e : events) steps.insert(e.step);
  }
  return {steps.begin(), steps.end()};
}

std::string format_bubbles(const std::vector<BubbleReport>& reports, const std::vector<int>& ranks) {
  std::string out = fmt::format("{:>6}  {:>10}  {:>7}  {}\n", "step", "span_ms", "bubble", "idle share per rank");
  for (const auto& r : reports) {
    out += fmt::format("{:>6}  {:>10.3f}  {:>6.1f}%  ", r.step, r.span_us / 1000.0, 100.0 * r.bubble);
    for (size_t i = 0; i < r.idle_share.size(); ++i) {
      const size_t rank = i < ranks.size() ? static_cast<size_t>(ranks[i]) : i;
      out += fmt::format("{}r{} {:.1f}%", i == 0 ? "" : "  ", rank, 100.0 * r.idle_share[i]);
    }
    out += '\n';
  }
  return out;
}

}  // namespace paratrain::pipeline

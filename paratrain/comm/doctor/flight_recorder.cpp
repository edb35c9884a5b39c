// The flight recorder's ring buffer and its JSON dump (see flight_recorder.h).
// The JSON is written by hand, one top-level field per line, so that the
// launcher (no JSON library, no LibTorch) can read the few fields it needs.
#include "paratrain/comm/doctor/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace paratrain::comm {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ranks[i]);
  }
  return out + "]";
}

std::mutex registry_mu;
std::vector<std::weak_ptr<FlightRecorder>>& registry() {
  static std::vector<std::weak_ptr<FlightRecorder>> recorders;
  return recorders;
}

}  // namespace

const char* to_string(RecordState state) {
  switch (state) {
    case RecordState::kInFlight: return "in_flight";
    case RecordState::kDone: return "done";
    case RecordState::kFailed: return "failed";
    case RecordState::kTimedOut: return "timed_out";
  }
  return "?";
}

FlightRecorder::FlightRecorder(int global_rank, std::size_t capacity)
    : rank_(global_rank), ring_(std::max<std::size_t>(capacity, 1)) {}

int64_t FlightRecorder::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int FlightRecorder::add_group(std::string name, std::vector<int> global_ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  int instance = 0;
  for (const auto& g : groups_) instance += g.ranks == global_ranks ? 1 : 0;
  groups_.push_back(RecordedGroup{std::move(name), std::move(global_ranks), instance, 0});
  return static_cast<int>(groups_.size()) - 1;
}

void FlightRecorder::rename_group(int id, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= 0 && id < static_cast<int>(groups_.size())) groups_[static_cast<std::size_t>(id)].name = std::move(name);
}

uint64_t FlightRecorder::begin(int id, const char* op, const at::Tensor* tensor, int peer) {
  CollectiveRecord r;
  r.group = id;
  r.op = op;
  r.peer = peer;
  if (tensor != nullptr && tensor->defined()) {
    r.dtype = c10::toString(tensor->scalar_type());
    r.numel = tensor->numel();
    r.ndim = static_cast<int>(tensor->dim());
    for (int d = 0; d < std::min(r.ndim, 4); ++d) r.shape[d] = tensor->size(d);
  }
  r.start_us = now_us();
  std::lock_guard<std::mutex> lock(mu_);
  r.index = total_++;
  r.seq = groups_[static_cast<std::size_t>(id)].next_seq++;
  ring_[r.index % ring_.size()] = r;
  return r.index;
}

void FlightRecorder::finish(uint64_t ticket, RecordState state, int64_t end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  CollectiveRecord& r = ring_[ticket % ring_.size()];
  if (r.index != ticket || r.state == RecordState::kDone) return;
  r.state = state;
  if (state == RecordState::kDone) r.end_us = end_us;
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveRecord> out;
  const uint64_t kept = std::min<uint64_t>(total_, ring_.size());
  for (uint64_t i = total_ - kept; i < total_; ++i) out.push_back(ring_[i % ring_.size()]);
  return out;
}

std::vector<RecordedGroup> FlightRecorder::groups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_;
}

std::string FlightRecorder::describe(const CollectiveRecord& r) const {
  const auto& g = groups_[static_cast<std::size_t>(r.group)];
  std::string shape;
  for (int d = 0; d < std::min(r.ndim, 4); ++d) {
    if (d > 0) shape += ',';
    shape += std::to_string(r.shape[d]);
  }
  if (r.ndim > 4) shape += ",...";
  std::string what = r.dtype[0] != '\0' ? fmt::format(" {}[{}]", r.dtype, shape) : std::string();
  std::string state = r.state == RecordState::kDone
                          ? "done"
                          : fmt::format("{} for {:.1f} s", to_string(r.state), (now_us() - r.start_us) / 1e6);
  return fmt::format("{} #{} on {} {}{}{}: {}", r.op, r.seq, g.name, rank_list(g.ranks),
                     r.peer >= 0 ? fmt::format(" (peer {})", r.peer) : std::string(), what, state);
}

std::string FlightRecorder::last_op() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (total_ == 0) return "no collective yet";
  const uint64_t kept = std::min<uint64_t>(total_, ring_.size());
  for (uint64_t i = total_ - kept; i < total_; ++i) {
    const auto& r = ring_[i % ring_.size()];
    if (r.state != RecordState::kDone) return describe(r);
  }
  return describe(ring_[(total_ - 1) % ring_.size()]);
}

std::string FlightRecorder::to_json(const std::string& reason, std::size_t last,
                                    const std::string& extra_fields) const {
  const auto recs = records();
  const std::string last_line = last_op();
  std::lock_guard<std::mutex> lock(mu_);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::time_t wall = std::time(nullptr);
  char when[32] = {0};
  std::tm tm{};
  gmtime_r(&wall, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string out = "{\n";
  out += "\"format\": \"paratrain-doctor-1\",\n";
  out += fmt::format("\"rank\": {},\n\"pid\": {},\n\"host\": {},\n", rank_, static_cast<long long>(getpid()),
                     quoted(host));
  out += fmt::format("\"reason\": {},\n\"dumped_at_us\": {},\n\"wall_time\": \"{}\",\n", quoted(reason), now_us(),
                     when);
  out += fmt::format("\"capacity\": {},\n\"total\": {},\n", ring_.size(), total_);
  out += fmt::format("\"last_op\": {},\n", quoted(last_line));
  out += extra_fields;
  out += "\"groups\": [";
  for (std::size_t i = 0; i < groups_.size(); ++i) {
    const auto& g = groups_[i];
    out += fmt::format("{}\n  {{\"id\": {}, \"name\": {}, \"ranks\": {}, \"instance\": {}, \"next_seq\": {}}}",
                       i ? "," : "", i, quoted(g.name), rank_list(g.ranks), g.instance, g.next_seq);
  }
  out += "\n],\n\"records\": [";
  const std::size_t first = last == 0 || recs.size() <= last ? 0 : recs.size() - last;
  for (std::size_t i = first; i < recs.size(); ++i) {
    const auto& r = recs[i];
    std::string shape = "[";
    for (int d = 0; d < std::min(r.ndim, 4); ++d) {
    if (d > 0) shape += ',';
    shape += std::to_string(r.shape[d]);
  }
    shape += "]";
    out += fmt::format(
        "{}\n  {{\"index\": {}, \"group\": {}, \"seq\": {}, \"op\": \"{}\", \"peer\": {}, \"dtype\": \"{}\", "
        "\"numel\": {}, \"ndim\": {}, \"shape\": {}, \"start_us\": {}, \"end_us\": {}, \"state\": \"{}\"}}",
        i > first ? "," : "", r.index, r.group, r.seq, r.op, r.peer, r.dtype, r.numel, r.ndim, shape, r.start_us,
        r.end_us < 0 ? std::string("null") : std::to_string(r.end_us), to_string(r.state));
  }
  out += "\n]\n}\n";
  return out;
}

void FlightRecorder::set_dump_dir(const std::filesystem::path& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  dump_dir_ = dir;
}

void FlightRecorder::set_abort_reason(std::string reason) {
  std::lock_guard<std::mutex> lock(mu_);
  abort_reason_ = std::move(reason);
}

std::string FlightRecorder::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_reason_;
}

std::filesystem::path FlightRecorder::dump_dir() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dump_dir_;
}

std::filesystem::path FlightRecorder::dump(const std::string& reason) const {
  const auto dir = dump_dir();
  if (dir.empty()) return {};
  const auto path = dir / fmt::format("rank-{}.json", rank_);
  try {
    std::filesystem::create_directories(dir);
    // Per writer: two threads of one process (the watchdog and a timed-out
    // wait) may dump the same rank at once; each renames its own file.
    const auto tmp = dir / fmt::format(".rank-{}.json.{}.{}.tmp", rank_, static_cast<long long>(getpid()),
                                       static_cast<unsigned long long>(now_us()));
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << to_json(reason);
      if (!f.flush()) throw std::runtime_error("write failed");
    }
    std::filesystem::rename(tmp, path);
    spdlog::info("hang doctor: rank {} wrote its last {} collectives to {} ({})", rank_,
                 std::min<uint64_t>(records().size(), ring_.size()), path.string(), reason);
  } catch (const std::exception& e) {
    spdlog::warn("hang doctor: rank {} could not write {}: {}", rank_, path.string(), e.what());
    return {};
  }
  return path;
}

void register_recorder(const std::shared_ptr<FlightRecorder>& recorder) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& all = registry();
  all.erase(std::remove_if(all.begin(), all.end(), [](const auto& w) { return w.expired(); }), all.end());
  all.push_back(recorder);
}

std::vector<std::shared_ptr<FlightRecorder>> live_recorders() {
  std::lock_guard<std::mutex> lock(registry_mu);
  std::vector<std::shared_ptr<FlightRecorder>> out;
  for (const auto& w : registry()) {
    if (auto r = w.lock()) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace paratrain::comm

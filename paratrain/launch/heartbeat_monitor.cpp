// Reading heartbeat files and noticing silent workers (see heartbeat_monitor.h).
#include "paratrain/launch/heartbeat_monitor.h"

#include <fstream>
#include <iterator>
#include <sstream>

namespace paratrain::launch {
namespace {

// The value of a `"key": value,` line, with a JSON string's quotes and
// escapes removed; nullopt when the line is not that key's.
std::optional<std::string> field(const std::string& line, const std::string& key) {
  const std::string prefix = "\"" + key + "\": ";
  if (line.rfind(prefix, 0) != 0) return std::nullopt;
  std::string value = line.substr(prefix.size());
  if (!value.empty() && value.back() == ',') value.pop_back();
  if (value.size() < 2 || value.front() != '"') return value;
  std::string out;
  for (std::size_t i = 1; i + 1 < value.size(); ++i) {
    if (value[i] == '\\' && i + 2 < value.size()) {
      ++i;
      out += value[i] == 'n' ? '\n' : value[i] == 't' ? '\t' : value[i];
    } else {
      out += value[i];
    }
  }
  return out;
}

}  // namespace

std::optional<Heartbeat> read_heartbeat(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  Heartbeat hb;
  bool has_beat = false, has_state = false;
  std::string line;
  while (std::getline(in, line)) {
    try {
      if (auto v = field(line, "beat")) {
        hb.beat = std::stoll(*v);
        has_beat = true;
      } else if (auto t = field(line, "timeout_ms")) {
        hb.timeout_ms = std::stoll(*t);
      } else if (auto p = field(line, "pid")) {
        hb.pid = std::stoll(*p);
      } else if (auto s = field(line, "state")) {
        hb.state = *s;
        has_state = true;
      } else if (auto o = field(line, "last_op")) {
        hb.last_op = *o;
      } else if (auto d = field(line, "doctor_dir")) {
        hb.doctor_dir = *d;
      }
    } catch (const std::exception&) {
      return std::nullopt;  // a number that is not one: not a heartbeat we wrote
    }
  }
  if (!has_beat || !has_state || hb.timeout_ms <= 0) return std::nullopt;
  return hb;
}

bool HeartbeatWatch::silent(Clock::time_point now) {
  auto hb = read_heartbeat(file_);
  if (!hb) return false;  // not beating yet, or caught mid-rename: the next read will tell
  if (!last_ || hb->beat != last_->beat) changed_at_ = now;
  last_ = std::move(hb);
  if (last_->state != "running") return false;
  return now - changed_at_ > std::chrono::milliseconds(last_->timeout_ms);
}

double HeartbeatWatch::silent_for(Clock::time_point now) const {
  return std::chrono::duration<double>(now - changed_at_).count();
}

}  // namespace paratrain::launch

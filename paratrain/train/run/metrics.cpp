// MetricsLog and progress-line helpers.
#include "paratrain/train/run/metrics.h"

#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::train {

MetricsLog::MetricsLog(const std::filesystem::path& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::app);
  if (!out_) throw Error(fmt::format("cannot open metrics file {} for appending; check run.output_dir", path.string()));
}

void MetricsLog::write(nlohmann::json record) {
  if (!out_.is_open()) return;
  if (!record.contains("time"))
    record["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  out_ << record.dump() << '\n';
  out_.flush();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<long>(std::lround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace paratrain::train

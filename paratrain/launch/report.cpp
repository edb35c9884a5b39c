// Outcome descriptions and the launcher's final summary (see report.h).
#include "paratrain/launch/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/launch/spawn.h"

namespace paratrain::launch {

std::string describe(const WorkerOutcome& w) {
  if (w.exited) return fmt::format("rank {} (pid {}) exited with code {}", w.rank, w.pid, w.exit_code);
  return fmt::format("rank {} (pid {}) was killed by {}", w.rank, w.pid, signal_name(w.signal));
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string summarize(LaunchReport& r) {
  const int n = static_cast<int>(r.workers.size());
  std::vector<int> succeeded;
  std::vector<std::string> other_failures, stopped;
  for (const auto& w : r.workers) {
    if (w.ok() && !w.stopped_by_launcher) {
      succeeded.push_back(w.rank);
    } else if (w.stopped_by_launcher) {
      stopped.push_back(describe(w));
    } else if (w.local_rank != r.first_failed) {
      other_failures.push_back(describe(w));
    }
  }

  std::string cause;
  if (r.received_signal != 0) {
    r.exit_code = 128 + r.received_signal;
    cause = fmt::format("interrupted by {}", signal_name(r.received_signal));
  } else if (r.first_failed >= 0) {
    r.exit_code = r.workers[r.first_failed].shell_code();
    cause = describe(r.workers[r.first_failed]) + " first";
  } else {
    r.exit_code = 0;
    for (const auto& w : r.workers) {
      // Unreachable when the supervisor records every failure; stay non-zero anyway.
      if (!w.ok()) r.exit_code = w.shell_code() != 0 ? w.shell_code() : 1;
    }
  }
  if (r.exit_code == 0) {
    return fmt::format("paratrain launch: all {} rank{} succeeded ({})", n, n == 1 ? "" : "s",
                       rank_list(succeeded));
  }
  std::string line = fmt::format("paratrain launch: FAILED with exit code {}", r.exit_code);
  if (!cause.empty()) line += ": " + cause;
  if (!other_failures.empty()) line += "; also failed: " + fmt::format("{}", fmt::join(other_failures, ", "));
  if (!stopped.empty()) line += "; stopped by the launcher: " + fmt::format("{}", fmt::join(stopped, ", "));
  line += "; succeeded: " + rank_list(succeeded);
  return line;
}

}  // namespace paratrain::launch

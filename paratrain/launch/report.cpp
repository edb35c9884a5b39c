// Outcome descriptions and the launcher's final summary (see report.h).
#include "paratrain/launch/report.h"

#include <cctype>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/launch/spawn.h"

namespace paratrain::launch {

std::string describe(const WorkerOutcome& w) {
  if (!w.hang.empty()) return fmt::format("rank {} (pid {}) {}", w.rank, w.pid, w.hang);
  if (w.exited) {
    return fmt::format("rank {} (pid {}) exited with code {}{}", w.rank, w.pid, w.exit_code,
                       w.peer_error && !w.ok() ? " (its output says a peer went away)" : "");
  }
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

int pick_first_failure(const std::vector<WorkerOutcome>& workers) {
  auto tier = [](const WorkerOutcome& w) {
    // Stopped by the launcher, but because it went silent: the cause itself.
    if (!w.hang.empty()) return 0;
    if (w.exited && !w.peer_error) return w.stopped_by_launcher ? 3 : 1;
    if (!w.exited && !w.stopped_by_launcher) return 2;
    return w.exited ? 4 : 5;
  };
  int best = -1;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const WorkerOutcome& w = workers[i];
    if (w.ok() || w.tolerated) continue;
    if (best < 0) {
      best = static_cast<int>(i);
      continue;
    }
    const WorkerOutcome& b = workers[static_cast<std::size_t>(best)];
    if (std::tuple(tier(w), w.ended_at, w.local_rank) < std::tuple(tier(b), b.ended_at, b.local_rank))
      best = static_cast<int>(i);
  }
  return best < 0 ? -1 : workers[static_cast<std::size_t>(best)].local_rank;
}

bool mentions_lost_peer(std::string_view output) {
  std::string lower(output);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* words : {"connection reset", "connection closed", "broken pipe", "peer"}) {
    if (lower.find(words) != std::string::npos) return true;
  }
  return false;
}

std::string summarize(LaunchReport& r) {
  const int n = static_cast<int>(r.workers.size());
  std::vector<int> succeeded;
  std::vector<std::string> other_failures, stopped, tolerated;
  for (const auto& w : r.workers) {
    if (w.tolerated) {
      tolerated.push_back(describe(w));
    } else if (w.ok() && !w.stopped_by_launcher) {
      succeeded.push_back(w.rank);
    } else if (w.local_rank == r.first_failed) {
      continue;
    } else if (w.stopped_by_launcher) {
      stopped.push_back(describe(w));
    } else {
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
      if (!w.ok() && !w.tolerated) r.exit_code = w.shell_code() != 0 ? w.shell_code() : 1;
    }
  }
  if (r.exit_code == 0 && !tolerated.empty()) {
    return fmt::format("paratrain launch: succeeded ({}) with --keep-going; lost on the way: {}",
                       rank_list(succeeded), fmt::join(tolerated, ", "));
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

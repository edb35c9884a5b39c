// Outcome descriptions and the launcher's final summary (see report.h).
#include "paratrain/launch/report.h"

#include <algorithm>

#include <cctype>
#include <regex>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/rank_list.h"
#include "paratrain/launch/spawn.h"

namespace paratrain::launch {

std::string describe(const WorkerOutcome& w) {
  if (!w.hang.empty()) return fmt::format("rank {} (pid {}) {}", w.rank, w.pid, w.hang);
  if (w.exited) {
    const std::string why = w.ok() || !w.peer_error ? ""
                            : w.peer_loss.empty()   ? " (its output says a peer went away)"
                                                    : " (its output says: " + w.peer_loss + ")";
    const std::string code = w.exit_code == kPeerLostExitCode
                                 ? fmt::format("{} (a peer was lost)", w.exit_code)
                                 : std::to_string(w.exit_code);
    return fmt::format("rank {} (pid {}) exited with code {}{}", w.rank, w.pid, code,
                       w.exit_code == kPeerLostExitCode && w.peer_loss.empty() ? "" : why);
  }
  return fmt::format("rank {} (pid {}) was killed by {}", w.rank, w.pid, signal_name(w.signal));
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  std::size_t groups = 0;
  for (std::size_t i = 0; i < ranks.size(); ++groups) {
    // One line whatever the count: scattered ranks stop after a few groups.
    if (groups == core::kNamedRanks) return out + fmt::format(" ... and {} more", ranks.size() - i);
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

// Note [Naming the lost node]
// A worker's error says how it lost a peer, in one of three forms: the peer
// watch's verdict ("peer heartbeats: rank 1 (pid P on host H, ADDR) sent no
// heartbeat for S s"), Gloo's closed connection naming only an address
// ("Connection closed by peer [10.77.0.2]:PORT"), to which the worker's peer
// watch appends "([10.77.0.2] is rank 1 on host H)", or a collective
// timeout. From the ranks the launcher knows the node (every node runs
// nproc_per_node ranks, node k ranks k*nproc .. k*nproc+nproc-1), and from
// the words whether a connection closed (the peer's processes or machine
// are gone) or nothing arrived (stopped, frozen, partitioned): the two ask
// for different actions, so the message never says "went away" for both.
std::optional<PeerLoss> read_peer_loss(std::string_view output) {
  const std::string text(output);
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  PeerLoss loss;
  std::smatch m;
  static const std::regex verdict(
      R"(peer heartbeats: rank (\d+) \(pid \d+ on host ([^,]+), ([^)]+)\) sent no heartbeat for ([0-9.]+) s)");
  static const std::regex named(R"(\[([^\]]+)\] is ranks? ([0-9, ]+) on host ([^)]+)\))");
  static const std::regex gloo_addr(R"(\[([0-9a-fA-F.:]+)\]:\d+)");
  if (std::regex_search(text, m, verdict)) {
    loss.kind = "heartbeat";
    loss.ranks = {std::stoi(m[1])};
    loss.host = m[2];
    loss.address = m[3];
    loss.silent_for = m[4];
    return loss;
  }
  for (const char* words : {"connection closed", "reset by peer", "broken pipe", "connection refused"}) {
    if (lower.find(words) != std::string::npos) loss.kind = "closed";
  }
  if (loss.kind == "unknown") {
    for (const char* words : {"did not complete within", "timed out", "timeouterror"}) {
      if (lower.find(words) != std::string::npos) loss.kind = "timeout";
    }
  }
  if (std::regex_search(text, m, named)) {
    loss.address = m[1];
    loss.host = m[3];
    std::stringstream ranks(m[2].str());
    for (std::string r; std::getline(ranks, r, ',');) {
      if (r.find_first_of("0123456789") != std::string::npos) loss.ranks.push_back(std::stoi(r));
    }
  } else if (std::regex_search(text, m, gloo_addr)) {
    loss.address = m[1];
  }
  if (loss.kind == "unknown" && loss.address.empty()) return std::nullopt;
  return loss;
}

std::string describe_peer_loss(std::string_view output, int nproc_per_node,
                               const std::vector<std::string>& node_names) {
  const auto loss = read_peer_loss(output);
  if (!loss) return "";
  std::string who;
  if (!loss->ranks.empty() && nproc_per_node > 0) {
    const int node = loss->ranks.front() / nproc_per_node;
    const bool named = node < static_cast<int>(node_names.size());
    who = named ? fmt::format("node '{}' (node rank {}", node_names[static_cast<std::size_t>(node)], node)
                : fmt::format("node {} (", node);
    std::string where = loss->host.empty() ? loss->address
                        : loss->address.empty() ? "host " + loss->host
                                                : fmt::format("host {}, {}", loss->host, loss->address);
    who += (named ? ", " : "") + where + "; " + rank_list(loss->ranks) + ")";
  } else if (!loss->address.empty()) {
    who = "the peer at " + loss->address;
  } else {
    who = "a peer";
  }
  if (loss->kind == "heartbeat") {
    return fmt::format("{} sent no heartbeat for {} s: lost (stopped, frozen or cut off by the network), not a "
                       "closed connection",
                       who, loss->silent_for);
  }
  if (loss->kind == "closed") {
    return fmt::format("the connection to {} was closed: its processes or its machine went away (not a timeout)",
                       who);
  }
  if (loss->kind == "timeout") {
    return fmt::format("a collective with {} timed out (world.timeout_s): the peer is stopped, too slow or cut off; "
                       "no connection was closed",
                       who);
  }
  return fmt::format("{} went away", who);
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

  // Note [Nobody succeeded]
  // --keep-going tolerates a failure so that the others go on; it does not
  // make a failure a success. When every rank failed (the survivors too,
  // each tolerated in turn under --keep-going-rank0), the job produced
  // nothing: it fails like a fail-fast launch, naming the likeliest cause
  // among the tolerated failures (pick_first_failure, as if none had been
  // tolerated). A received signal still decides the exit code.
  if (r.first_failed < 0 && r.received_signal == 0 && succeeded.empty() && !tolerated.empty()) {
    std::vector<WorkerOutcome> untolerated = r.workers;
    for (auto& w : untolerated) w.tolerated = false;
    r.first_failed = pick_first_failure(untolerated);
    tolerated.clear();
    for (const auto& w : r.workers) {
      if (w.local_rank != r.first_failed && !w.ok()) other_failures.push_back(describe(w));
    }
    r.exit_code = r.workers[static_cast<std::size_t>(r.first_failed)].shell_code();
    std::string line = fmt::format("paratrain launch: FAILED with exit code {}: no rank succeeded (--keep-going let "
                                   "the others go on, and every one failed): {} first",
                                   r.exit_code, describe(r.workers[static_cast<std::size_t>(r.first_failed)]));
    if (!other_failures.empty()) line += "; also failed: " + fmt::format("{}", fmt::join(other_failures, ", "));
    return line;
  }

  // Note [A preempted launch]
  // Ranks that stopped at a preemption checkpoint exit kPreemptedExitCode;
  // when every rank did so (or finished), the launch did what the signal
  // asked, whether the signal reached the launcher (and was passed on) or
  // a rank: it exits with the same code, and nothing restarts it.
  const bool any_preempted = std::any_of(r.workers.begin(), r.workers.end(), [](const auto& w) { return w.preempted(); });
  const bool all_done = std::all_of(r.workers.begin(), r.workers.end(), [](const auto& w) { return w.ok() || w.preempted(); });
  if (any_preempted && all_done) {
    std::vector<int> preempted;
    for (const auto& w : r.workers)
      if (w.preempted()) preempted.push_back(w.rank);
    r.exit_code = kPreemptedExitCode;
    r.first_failed = -1;
    return fmt::format("paratrain launch: preempted (exit code {}): {} stopped at a checkpoint{}; the next start "
                       "with train.resume = \"auto\" continues from it",
                       kPreemptedExitCode, rank_list(preempted),
                       r.received_signal ? fmt::format(" after the launcher passed on {}", signal_name(r.received_signal))
                                         : std::string());
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

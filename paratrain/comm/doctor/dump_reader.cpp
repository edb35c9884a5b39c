// The hang doctor's diagnosis (see doctor.h): read the dumps, compare the
// ranks' sequence numbers per group, say who is behind; draw a Chrome trace.
// The trace is written here rather than through pipeline/chrome_trace.h:
// that writer converts pipeline timelines (forward/backward/send per
// micro-batch), while these rows are collectives with a group and a sequence
// number, and both are a few lines of the same Trace Event Format.
#include "paratrain/comm/doctor/dump_reader.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

using nlohmann::json;

std::string ranks_text(const std::vector<int>& ranks) { return fmt::format("[{}]", fmt::join(ranks, ",")); }

// "rank 3" / "ranks 0,1,2".
std::string who(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ","));
}

// Ops whose tensor has the same size on every member; for the others
// (uneven gathers, all_to_all with splits, p2p) a size difference is normal.
bool same_size_everywhere(const std::string& op) {
  return op == "all_reduce" || op == "broadcast" || op == "reduce" || op == "reduce_scatter" ||
         op == "all_gather";
}

// A group as every member names it: its members and which of the member's
// groups with those members it is (instance).
struct GroupKey {
  std::vector<int> ranks;
  int instance = 0;
  bool operator<(const GroupKey& o) const { return std::tie(ranks, instance) < std::tie(o.ranks, o.instance); }
};

struct MemberView {
  const RankDump* dump = nullptr;
  int64_t next_seq = 0;                    // 0 when the rank never created the group
  std::map<int64_t, const DumpRecord*> by_seq;
};

std::string op_text(const DumpRecord& r) {
  std::string shape;
  if (!r.dtype.empty()) shape = fmt::format(" {}[{}]", r.dtype, fmt::join(r.shape, ","));
  return fmt::format("{} #{}{}", r.op, r.seq, shape);
}

// Note [Dumps are not simultaneous]
// Ranks dump one after another (each when its watchdog gets the signal), and
// in a healthy job one rank is always a little behind: it is still computing
// while its peer already waits in the next collective. So member `v` lags
// only when some member had already waited at least `min_lag_us` in the
// collective `v` had not issued, when `v` dumped: a hang, not a moment. The
// steady clock is one clock on a host; across hosts the times cannot be
// compared, so there the difference counts. A dump saved from a rank's last
// heartbeat (reason "heartbeat": the launcher found it silent) is final: that
// rank never issued anything after it.
bool lagging(const MemberView& v, const std::map<int, MemberView>& members, int64_t min_lag_us) {
  if (v.dump->reason == "heartbeat") return true;
  for (const auto& [r, other] : members) {
    if (other.next_seq <= v.next_seq) continue;
    if (other.dump->host != v.dump->host) return true;
    auto it = other.by_seq.find(v.next_seq);
    if (it == other.by_seq.end()) return true;  // left the ring: long ago
    if (v.dump->dumped_at_us - it->second->start_us >= min_lag_us) return true;
  }
  return false;
}

}  // namespace

RankDump parse_dump(const json& doc, const std::string& where) {
  try {
    RankDump d;
    d.rank = doc.at("rank").get<int>();
    d.pid = doc.value("pid", 0LL);
    d.host = doc.value("host", "");
    d.reason = doc.value("reason", "");
    d.dumped_at_us = doc.at("dumped_at_us").get<int64_t>();
    d.last_op = doc.value("last_op", "");
    for (const auto& g : doc.at("groups")) {
      d.groups.push_back(DumpGroup{g.at("name").get<std::string>(), g.at("ranks").get<std::vector<int>>(),
                                   g.value("instance", 0), g.at("next_seq").get<int64_t>()});
    }
    for (const auto& r : doc.at("records")) {
      DumpRecord rec;
      rec.group = r.at("group").get<int>();
      if (rec.group < 0 || rec.group >= static_cast<int>(d.groups.size()))
        throw Error(fmt::format("record names group {} of {}", rec.group, d.groups.size()));
      rec.seq = r.at("seq").get<int64_t>();
      rec.op = r.at("op").get<std::string>();
      rec.peer = r.value("peer", -1);
      rec.dtype = r.value("dtype", "");
      rec.shape = r.value("shape", std::vector<int64_t>{});
      rec.numel = r.value("numel", 0LL);
      rec.start_us = r.at("start_us").get<int64_t>();
      rec.end_us = r.at("end_us").is_null() ? -1 : r.at("end_us").get<int64_t>();
      rec.state = r.at("state").get<std::string>();
      d.records.push_back(std::move(rec));
    }
    return d;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("hang doctor: {} is not a doctor dump: {}", where, e.what()));
  }
}

std::vector<RankDump> read_dumps(const std::filesystem::path& doctor_dir) {
  std::vector<RankDump> dumps;
  static const std::regex name(R"(rank-(\d+)\.json)");
  if (std::filesystem::is_directory(doctor_dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(doctor_dir)) {
      const std::string file = entry.path().filename().string();
      if (!std::regex_match(file, name)) continue;
      std::ifstream in(entry.path());
      json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (doc.is_discarded()) throw Error(fmt::format("hang doctor: {} is not valid JSON", entry.path().string()));
      dumps.push_back(parse_dump(doc, entry.path().string()));
    }
  }
  if (dumps.empty()) {
    throw Error(fmt::format("hang doctor: no dumps (rank-N.json) in {}. Ranks write them on a collective "
                            "timeout, on SIGUSR1 (kill -USR1 <pid>, or to `paratrain launch`, which forwards it), "
                            "or when `paratrain doctor --run RUN_DIR` asks running ranks for them",
                            doctor_dir.string()));
  }
  std::sort(dumps.begin(), dumps.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return dumps;
}

std::string DoctorReport::text() const { return fmt::format("{}", fmt::join(lines, "\n")); }

// Note [Finding the rank behind]
// Every member of a group issues the group's collectives in the same order,
// so the k-th collective has sequence number k on every member (the recorder
// counts per group). A healthy job's members therefore differ by at most the
// collectives in flight right now, all at the same number. When a rank skips
// a collective, stops, or is stuck outside the collectives (a data loader, a
// deadlock of its own), the others go on to the next number and block there:
// the members that issued fewer collectives on a group are behind, and the
// collective the others wait in is the one they never joined. Groups are
// matched across ranks by their members and, for twins with the same members,
// by creation order (`instance`), which is the same on every member because
// groups are created collectively. A rank that issued as many collectives as
// the others but a different op at some number (a broadcast where they
// all-reduce) is a mismatch: the ranks disagree on the program, not on time.
DoctorReport diagnose(const std::vector<RankDump>& dumps, int world_size, double min_lag_s) {
  const auto min_lag_us = static_cast<int64_t>(min_lag_s * 1e6);
  DoctorReport report;
  std::map<int, const RankDump*> by_rank;
  for (const auto& d : dumps) by_rank[d.rank] = &d;

  std::map<GroupKey, std::string> names;
  for (const auto& d : dumps) {
    for (const auto& g : d.groups) names.emplace(GroupKey{g.ranks, g.instance}, g.name);
  }
  std::set<int> everyone;
  for (int r = 0; r < world_size; ++r) everyone.insert(r);
  for (const auto& [key, name] : names) everyone.insert(key.ranks.begin(), key.ranks.end());

  for (const auto& d : dumps) {
    report.lines.push_back(fmt::format("rank {} (pid {} on {}, dump: {}): {}", d.rank, d.pid, d.host, d.reason,
                                       d.last_op));
  }
  std::vector<int> no_dump;
  for (int r : everyone) {
    if (!by_rank.count(r)) no_dump.push_back(r);
  }
  if (!no_dump.empty()) {
    report.diverged = true;
    report.lines.push_back(fmt::format("{}: no dump (dead, not asked, or its host's dumps are elsewhere)",
                                       who(no_dump)));
  }

  for (const auto& [key, name] : names) {
    const std::string label = fmt::format("{} {}", name, ranks_text(key.ranks));
    std::map<int, MemberView> members;
    GroupVerdict verdict;
    verdict.group = label;
    for (int r : key.ranks) {
      auto it = by_rank.find(r);
      if (it == by_rank.end()) {
        verdict.missing.push_back(r);
        continue;
      }
      MemberView view;
      view.dump = it->second;
      for (std::size_t id = 0; id < view.dump->groups.size(); ++id) {
        const auto& g = view.dump->groups[id];
        if (g.ranks != key.ranks || g.instance != key.instance) continue;
        view.next_seq = g.next_seq;
        for (const auto& rec : view.dump->records) {
          if (rec.group == static_cast<int>(id)) view.by_seq[rec.seq] = &rec;
        }
      }
      members[r] = std::move(view);
    }
    if (members.size() < 2) {
      // Nobody to compare with; a member without a dump is still worth saying.
      if (!verdict.missing.empty()) {
        verdict.message = fmt::format("{} of {} left no dump", who(verdict.missing), label);
        report.lines.push_back(verdict.message);
        report.groups.push_back(std::move(verdict));
      }
      continue;
    }

    int64_t most = 0;
    for (const auto& [r, v] : members) most = std::max(most, v.next_seq);
    std::map<int64_t, std::vector<int>> behind_at;  // next_seq -> ranks
    std::vector<int> not_yet;  // fewer collectives, but only because its dump came first
    for (const auto& [r, v] : members) {
      if (v.next_seq == most) {
        verdict.ahead.push_back(r);
      } else if (lagging(v, members, min_lag_us)) {
        behind_at[v.next_seq].push_back(r);
        verdict.behind.push_back(r);
      } else {
        not_yet.push_back(r);
      }
    }
    if (verdict.behind.empty()) verdict.ahead.insert(verdict.ahead.end(), not_yet.begin(), not_yet.end());
    std::sort(verdict.ahead.begin(), verdict.ahead.end());
    // The first number at which two members recorded different collectives.
    std::map<int64_t, std::vector<std::pair<int, const DumpRecord*>>> at_seq;
    for (const auto& [r, v] : members) {
      for (const auto& [seq, rec] : v.by_seq) at_seq[seq].push_back({r, rec});
    }
    for (const auto& [seq, recs] : at_seq) {
      const DumpRecord& first = *recs.front().second;
      for (const auto& [r, rec] : recs) {
        // A send on one member is a recv on its peer: point-to-point ops
        // pair up across members instead of matching.
        const bool p2p = (rec->op == "send" || rec->op == "recv") && (first.op == "send" || first.op == "recv");
        const bool differ =
            !p2p && (rec->op != first.op || (same_size_everywhere(first.op) && rec->numel != first.numel));
        if (differ && verdict.mismatch_seq < 0) {
          verdict.mismatch_seq = seq;
          verdict.message = fmt::format(
              "{}: the ranks called different collectives at #{}: rank {} issued {}, rank {} issued {}", label, seq,
              recs.front().first, op_text(first), r, op_text(*rec));
        }
      }
    }

    if (!verdict.behind.empty()) {
      // What the ranks ahead are in: their newest collective on this group.
      const MemberView& lead = members.at(verdict.ahead.front());
      auto newest = lead.by_seq.find(most - 1);
      std::string ahead_what = newest != lead.by_seq.end()
                                   ? fmt::format("{} ({})", op_text(*newest->second), newest->second->state)
                                   : fmt::format("#{}", most - 1);
      const bool waiting = newest != lead.by_seq.end() && newest->second->state != "done";
      std::vector<std::string> parts;
      for (const auto& [next, ranks] : behind_at) {
        const MemberView& v = members.at(ranks.front());
        auto last = v.by_seq.find(next - 1);
        if (next == 0) {
          parts.push_back(fmt::format("{} issued no collective on {} yet", who(ranks), label));
        } else if (last != v.by_seq.end() && last->second->state != "done") {
          parts.push_back(fmt::format("{} {} in {} on {} ({})", who(ranks), ranks.size() == 1 ? "is" : "are",
                                      op_text(*last->second), label, last->second->state));
        } else {
          parts.push_back(fmt::format("{} finished {} on {} and issued nothing after it (it skipped the next "
                                      "collective, or is stuck or stopped outside the collectives)",
                                      who(ranks), last != v.by_seq.end() ? op_text(*last->second)
                                                                         : fmt::format("#{}", next - 1),
                                      label));
        }
      }
      const bool one = verdict.ahead.size() == 1;
      verdict.message = fmt::format("{} while {} {} {}", fmt::join(parts, "; "), who(verdict.ahead),
                                    waiting ? (one ? "waits in" : "wait in") : (one ? "has issued" : "have issued"),
                                    ahead_what) +
                        (verdict.message.empty() ? "" : "; also " + verdict.message);
    }
    if (!verdict.missing.empty()) {
      const std::string missing =
          fmt::format("{} of {} left no dump", who(verdict.missing), label);
      verdict.message = verdict.message.empty() ? missing : verdict.message + "; " + missing;
    }
    if (!verdict.message.empty()) {
      if (!verdict.behind.empty() || verdict.mismatch_seq >= 0) report.diverged = true;
      report.lines.push_back(verdict.message);
      report.groups.push_back(std::move(verdict));
    } else {
      // Agreeing members may still all be inside one collective: no rank is
      // behind at this layer, so the hang (if any) is inside the backend.
      std::vector<int> inside;
      const DumpRecord* rec = nullptr;
      for (const auto& [r, v] : members) {
        auto it = v.by_seq.find(most - 1);
        if (it != v.by_seq.end() && it->second->state != "done") {
          inside.push_back(r);
          rec = it->second;
        }
      }
      if (rec != nullptr) {
        report.lines.push_back(fmt::format("{}: no rank behind; {} in {} ({}): if that lasts, the collective "
                                           "itself is stuck (network, backend) or very slow",
                                           label, who(inside), op_text(*rec), rec->state));
      }
    }
  }
  if (!report.diverged) {
    report.lines.push_back(fmt::format("no divergence: on every group, all {} ranks with a dump issued the same "
                                       "collectives",
                                       dumps.size()));
  }
  return report;
}

json doctor_trace(const std::vector<RankDump>& dumps, double seconds) {
  int64_t newest = 0;
  for (const auto& d : dumps) newest = std::max(newest, d.dumped_at_us);
  const int64_t from = newest - static_cast<int64_t>(seconds * 1e6);
  json events = json::array();
  for (const auto& d : dumps) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", d.rank},
                      {"args", {{"name", fmt::format("rank {} ({})", d.rank, d.reason)}}}});
    for (const auto& r : d.records) {
      const int64_t end = r.end_us >= 0 ? r.end_us : d.dumped_at_us;
      if (end < from) continue;
      const int64_t start = std::max(r.start_us, from);
      const auto& g = d.groups[static_cast<std::size_t>(r.group)];
      events.push_back({{"name", fmt::format("{} #{} ({})", r.op, r.seq, g.name)},
                        {"cat", g.name},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", d.rank},
                        {"ts", start - from},
                        {"dur", std::max<int64_t>(end - start, 1)},
                        {"args",
                         {{"group", ranks_text(g.ranks)},
                          {"seq", r.seq},
                          {"dtype", r.dtype},
                          {"shape", r.shape},
                          {"state", r.state}}}});
    }
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace paratrain::comm

// summarize, format_summary, summary_json: see summary.h.
#include "paratrain/profile/summary.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/phase.h"
#include "paratrain/profile/intervals.h"

namespace paratrain::profile {
namespace {

// Note [Where a step's time went]
// A step is the loop thread's interval from asking for its first
// micro-batch to the end of its optimizer step. On that thread:
//   data      = the "data" phases (waiting for the loader, moving a batch),
//   busy      = the operators the thread ran outside data phases,
//   compute   = busy outside "optimizer" phases; optimizer = busy inside,
//   comm      = the union of this rank's collectives (the flight recorder:
//               from issue to completion, on the backend's threads),
//   exposed   = comm minus busy minus data: the thread waited for a peer
//               or for the wire with nothing to compute,
//   overlapped= comm within busy: hidden behind compute,
//   idle      = the rest (framework overhead between operators, sleeps).
// data + compute + optimizer + exposed + idle = the step's wall time by
// construction, and a rank that arrives late at a collective makes the
// others' exposed time grow by its delay: the straggler of a step is the
// rank with the least exposed communication.
bool is_comm_op(const std::string& name) {
  for (const char* prefix : {"gloo:", "nccl:", "mpi:", "c10d", "record_param_comms"})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

bool counts_as_op(const OpEvent& e) { return !e.user_scope && !e.gpu && e.name != "[memory]" && !is_comm_op(e.name); }

Intervals phase(const RankProfile& p, const char* name) {
  std::vector<std::pair<int64_t, int64_t>> parts;
  for (const auto& e : p.events)
    if (e.user_scope && e.thread == p.loop_thread && e.name == name) parts.emplace_back(e.start_us, e.start_us + e.dur_us);
  return Intervals(std::move(parts));
}

StepBreakdown breakdown(const RankProfile& p, const StepSpan& s, const Intervals& data_all, const Intervals& opt_all,
                        const Intervals& ops_all) {
  const Intervals data = data_all.clip(s.start_us, s.end_us);
  const Intervals busy = ops_all.clip(s.start_us, s.end_us).minus(data);
  const Intervals optimizer = busy.intersect(opt_all);
  std::vector<std::pair<int64_t, int64_t>> comm_parts;
  StepBreakdown b;
  for (const auto& c : p.collectives) {
    if (c.end_us <= s.start_us || c.start_us >= s.end_us) continue;
    comm_parts.emplace_back(c.start_us, c.end_us);
    b.comm_bytes += c.bytes;
    ++b.collectives;
  }
  const Intervals comm = Intervals(std::move(comm_parts)).clip(s.start_us, s.end_us);
  const Intervals exposed = comm.minus(busy).minus(data);
  const int64_t covered = busy.unite(data).unite(comm).length();
  constexpr double kMs = 1e-3;
  b.step = s.step;
  b.rank = p.rank;
  b.wall_ms = (s.end_us - s.start_us) * kMs;
  b.data_ms = data.length() * kMs;
  b.optimizer_ms = optimizer.length() * kMs;
  b.compute_ms = (busy.length() - optimizer.length()) * kMs;
  b.exposed_comm_ms = exposed.length() * kMs;
  b.overlapped_comm_ms = comm.intersect(busy).length() * kMs;
  b.idle_ms = (s.end_us - s.start_us - covered) * kMs;
  return b;
}

// Self time: an operator's duration minus that of the operators directly
// inside it on the same thread (events sorted by start).
void add_op_stats(const RankProfile& p, std::map<std::string, OpStat>& stats) {
  std::map<uint64_t, std::vector<const OpEvent*>> by_thread;
  for (const auto& e : p.events) {
    if (!counts_as_op(e)) continue;
    const bool in_step = std::any_of(p.steps.begin(), p.steps.end(), [&](const StepSpan& s) {
      return e.start_us >= s.start_us && e.start_us < s.end_us;
    });
    if (in_step) by_thread[e.thread].push_back(&e);
  }
  for (auto& [thread, events] : by_thread) {
    std::vector<std::pair<const OpEvent*, int64_t>> open;  // event, its children's time
    auto close = [&](int64_t before) {
      while (!open.empty() && open.back().first->start_us + open.back().first->dur_us <= before) {
        auto [e, children] = open.back();
        open.pop_back();
        OpStat& s = stats[e->name];
        s.name = e->name;
        ++s.calls;
        s.total_ms += e->dur_us * 1e-3;
        s.self_ms += std::max<int64_t>(0, e->dur_us - children) * 1e-3;
        if (!open.empty()) open.back().second += e->dur_us;
      }
    };
    for (const OpEvent* e : events) {
      close(e->start_us);
      open.emplace_back(e, 0);
    }
    close(INT64_MAX);
  }
}

}  // namespace

ProfileSummary summarize(std::vector<RankProfile> ranks, int top) {
  ProfileSummary out;
  std::map<std::string, OpStat> stats;
  for (const auto& p : ranks) {
    const Intervals data = phase(p, kPhaseData), opt = phase(p, kPhaseOptimizer);
    std::vector<std::pair<int64_t, int64_t>> op_parts;
    for (const auto& e : p.events)
      if (counts_as_op(e) && e.thread == p.loop_thread) op_parts.emplace_back(e.start_us, e.start_us + e.dur_us);
    const Intervals ops(std::move(op_parts));
    for (const auto& s : p.steps) out.steps.push_back(breakdown(p, s, data, opt, ops));
    add_op_stats(p, stats);
  }
  std::sort(out.steps.begin(), out.steps.end(), [](const StepBreakdown& a, const StepBreakdown& b) {
    return a.step != b.step ? a.step < b.step : a.rank < b.rank;
  });
  for (size_t i = 0; i < out.steps.size();) {
    size_t j = i;
    while (j < out.steps.size() && out.steps[j].step == out.steps[i].step) ++j;
    if (j - i >= 2) {
      auto least = std::min_element(out.steps.begin() + i, out.steps.begin() + j, [](const auto& a, const auto& b) {
        return a.exposed_comm_ms < b.exposed_comm_ms;
      });
      Straggler st{out.steps[i].step, least->rank, 0.0, -1};
      for (size_t k = i; k < j; ++k) {
        const double waited = out.steps[k].exposed_comm_ms - least->exposed_comm_ms;
        if (out.steps[k].rank != least->rank && waited >= st.waited_ms) {
          st.waited_ms = waited;
          st.waiting_rank = out.steps[k].rank;
        }
      }
      out.stragglers.push_back(st);
    }
    i = j;
  }
  for (auto& [name, s] : stats) out.top_ops.push_back(s);
  std::sort(out.top_ops.begin(), out.top_ops.end(), [](const OpStat& a, const OpStat& b) { return a.self_ms > b.self_ms; });
  if (static_cast<int>(out.top_ops.size()) > top) out.top_ops.resize(static_cast<size_t>(top));
  for (auto& p : ranks) {
    p.events.clear();
    p.collectives.clear();
  }
  out.ranks = std::move(ranks);
  return out;
}

std::string format_summary(const ProfileSummary& s) {
  std::string out;
  for (const auto& p : s.ranks)
    out += fmt::format("rank {} on {}: {} profiler, clock {} (offset {} us, measured skew {} us), {}; profiling "
                       "cost: {:.2f} ms per step profiled vs {:.2f} ms before ({} steps){}\n",
                       p.rank, p.host, p.profiler, p.clock.method, p.clock.offset_us, p.clock.skew_us,
                       p.collectives_source, p.overhead.profiled_step_ms, p.overhead.unprofiled_step_ms,
                       p.overhead.unprofiled_steps,
                       p.dropped_collectives ? fmt::format("; {} collectives lost (raise world.doctor_records)",
                                                           p.dropped_collectives)
                                             : "");
  out += fmt::format("\n{:>6} {:>4} {:>9} {:>8} {:>9} {:>9} {:>9} {:>10} {:>8} {:>11} {:>5}\n", "step", "rank",
                     "wall ms", "data", "compute", "optimizer", "exposed", "overlapped", "idle", "comm MB", "colls");
  for (const auto& b : s.steps)
    out += fmt::format("{:>6} {:>4} {:>9.2f} {:>8.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>10.2f} {:>8.2f} {:>11.3f} {:>5}\n",
                       b.step, b.rank, b.wall_ms, b.data_ms, b.compute_ms, b.optimizer_ms, b.exposed_comm_ms,
                       b.overlapped_comm_ms, b.idle_ms, b.comm_bytes / 1e6, b.collectives);
  if (!s.stragglers.empty()) {
    out += "\nstragglers (the rank with the least exposed communication: the others waited for it)\n";
    for (const auto& st : s.stragglers)
      out += fmt::format("  step {}: rank {}; rank {} waited {:.2f} ms more for it\n", st.step, st.rank,
                         st.waiting_rank, st.waited_ms);
  }
  out += fmt::format("\ntop operators by self time (all profiled steps and ranks)\n{:>10} {:>10} {:>7}  {}\n",
                     "self ms", "total ms", "calls", "operator");
  for (const auto& o : s.top_ops)
    out += fmt::format("{:>10.2f} {:>10.2f} {:>7}  {}\n", o.self_ms, o.total_ms, o.calls, o.name);
  return out;
}

nlohmann::json summary_json(const ProfileSummary& s) {
  nlohmann::json steps = nlohmann::json::array(), ops = nlohmann::json::array(), stragglers = nlohmann::json::array(),
                 ranks = nlohmann::json::array();
  for (const auto& b : s.steps)
    steps.push_back({{"step", b.step}, {"rank", b.rank}, {"wall_ms", b.wall_ms}, {"data_ms", b.data_ms},
                     {"compute_ms", b.compute_ms}, {"optimizer_ms", b.optimizer_ms},
                     {"exposed_comm_ms", b.exposed_comm_ms}, {"overlapped_comm_ms", b.overlapped_comm_ms},
                     {"idle_ms", b.idle_ms}, {"comm_bytes", b.comm_bytes}, {"collectives", b.collectives}});
  for (const auto& o : s.top_ops)
    ops.push_back({{"name", o.name}, {"calls", o.calls}, {"self_ms", o.self_ms}, {"total_ms", o.total_ms}});
  for (const auto& st : s.stragglers)
    stragglers.push_back({{"step", st.step}, {"straggler", st.rank}, {"waited_ms", st.waited_ms},
                          {"waiting_rank", st.waiting_rank}});
  for (const auto& p : s.ranks) {
    nlohmann::json r = to_json(p);
    r.erase("events");
    r.erase("collectives");
    ranks.push_back(std::move(r));
  }
  return {{"steps", steps}, {"top_operators", ops}, {"stragglers", stragglers}, {"ranks", ranks}};
}

}  // namespace paratrain::profile

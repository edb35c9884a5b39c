// The server's side of a multi-process round (Note [Federated round] in
// round.h): sample among live clients, send, collect until the round can
// close, recover secure aggregation's masks, apply. It never blocks on one
// client process: everything arrives as events from ServerLinks (mailbox.h).
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/federated/round.h"
#include "paratrain/federated/sampling.h"
#include "paratrain/federated/secure_aggregation.h"

namespace paratrain::federated {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

bool round_can_close(int64_t outstanding, int64_t reported, int64_t min_clients, bool deadline_passed) {
  return outstanding == 0 || (deadline_passed && reported >= min_clients);
}

RoundReport FederatedRun::server_round(int64_t round) {
  const auto& f = config_.federated;
  const uint64_t seed = static_cast<uint64_t>(config_.run.seed);
  const int64_t numel = global_.numel();
  RoundReport report;
  report.round = round;

  // Whom each phase still waits for; a lost process leaves all of them.
  std::map<int, std::vector<int64_t>> participants_of;  // host rank -> its participants, ascending
  std::set<int64_t> expected;  // participants whose keys (secure) or update have not arrived
  std::set<int> answering;     // hosts whose recovery seeds are needed
  bool recovery_failed = false;
  auto lose = [&](int rank, const std::string& why) {
    if (std::binary_search(lost_ranks_.begin(), lost_ranks_.end(), rank)) return;
    lost_ranks_.insert(std::upper_bound(lost_ranks_.begin(), lost_ranks_.end(), rank), rank);
    report.lost_ranks.push_back(rank);
    std::vector<int64_t> hosted;
    for (int64_t c = 0; c < f.clients; ++c) {
      if (host_of(c) == rank) hosted.push_back(c);
    }
    // This round's participants of that process that have not reported yet.
    std::vector<int64_t> now;
    for (int64_t c : participants_of[rank]) {
      if (expected.erase(c)) now.push_back(c);
    }
    spdlog::error("round {}: lost client process rank {} ({}); its clients [{}] are never selected again{}", round,
                  rank, why, fmt::join(hosted, ", "),
                  now.empty() ? std::string()
                              : fmt::format(", and this round's [{}] still training are dropped", fmt::join(now, ", ")));
    if (answering.count(rank)) recovery_failed = true;
    answering.erase(rank);
  };
  // Processes whose loss the links saw but no round has handled yet.
  auto catch_up = [&] {
    for (int r = 1; r < world_.size(); ++r) {
      if (!links_->alive(r)) lose(r, links_->why(r));
    }
  };

  // 1. sample among the clients of live processes
  catch_up();
  const auto pool = live_pool();
  if (pool.empty())
    throw CommError(fmt::format("round {}: every client process is gone (lost ranks {}); the run cannot continue",
                                round, fmt::join(lost_ranks_, ", ")));
  report.pool = static_cast<int64_t>(pool.size());
  const int64_t count =
      std::clamp<int64_t>(std::llround(f.fraction * static_cast<double>(f.clients)), 1, report.pool);
  report.sampled = sample_from(pool, count, seed, round);
  std::vector<int64_t> participants;
  for (int64_t c : report.sampled) {
    if (client_drops(f.dropout, seed, round, c)) {
      report.dropped.push_back(c);
      continue;
    }
    participants.push_back(c);
    participants_of[host_of(c)].push_back(c);
  }

  // 2. download: every live host hears of the round, hosts with participants get x_t
  const auto hosts = links_->live_peers();
  for (int h : hosts) {
    const auto& mine = participants_of[h];
    links_->post(h, Message{MessageKind::kRound, round, -1, ids_tensor(mine)});
    if (!mine.empty()) links_->post(h, Message{MessageKind::kModel, round, -1, global_.clone()});
  }
  const auto deadline = f.round_timeout_s > 0
                            ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(f.round_timeout_s))
                            : Clock::now() + kIdleWait;

  // One event (false: `until` passed first). Messages of closed rounds are
  // late: an update is logged and discarded, anything else ignored.
  auto next_event = [&](Clock::time_point until, const std::function<void(Message&)>& on_message) {
    auto e = links_->next(until);
    if (!e) return false;
    if (!e->message) {
      lose(e->peer, e->why);
    } else if (e->message->round != round) {
      if (e->message->kind == MessageKind::kUpdate)
        spdlog::info("round {}: client {} (rank {}) reported for round {} after it closed; discarded", round,
                     e->message->client, e->peer, e->message->round);
    } else {
      on_message(*e->message);
    }
    return true;
  };
  // Waits until the deadline, then (too few reports) for as long as it takes.
  auto wait_until = [&] { return Clock::now() < deadline ? deadline : Clock::now() + kIdleWait; };
  auto hosted_by = [&](int64_t c, int rank) { return c >= 0 && c < f.clients && host_of(c) == rank; };

  // Secure aggregation, key exchange: the keys that arrive in time define the participants.
  std::map<int64_t, Key> keyed;
  std::vector<int64_t> secure_ids;
  std::vector<Key> secure_keys;
  if (f.secure_aggregation) {
    for (int64_t c : participants) {
      if (links_->alive(host_of(c))) expected.insert(c);
    }
    while (!round_can_close(static_cast<int64_t>(expected.size()), static_cast<int64_t>(keyed.size()),
                            f.min_clients, Clock::now() >= deadline)) {
      next_event(wait_until(), [&](Message& m) {
        if (m.kind != MessageKind::kKeys) return;
        std::vector<int64_t> ids;
        std::vector<Key> keys;
        read_key_rows(m.payload, 1, ids, keys);
        for (size_t i = 0; i < ids.size(); ++i) {
          if (!hosted_by(ids[i], m.from) || !expected.count(ids[i])) continue;
          keyed[ids[i]] = keys[i];
          expected.erase(ids[i]);
        }
      });
    }
    for (const auto& [id, key] : keyed) {
      secure_ids.push_back(id);
      secure_keys.push_back(key);
    }
    const at::Tensor list = key_rows(secure_ids, secure_keys, 1);
    for (int h : hosts) {
      if (!participants_of[h].empty()) links_->post(h, Message{MessageKind::kKeyList, round, -1, list});
    }
    expected.clear();
  }

  // 3-4. collect updates until the round can close
  const std::vector<int64_t>& uploaders = f.secure_aggregation ? secure_ids : participants;
  for (int64_t c : uploaders) {
    if (links_->alive(host_of(c))) expected.insert(c);
  }
  const auto want_type = f.secure_aggregation ? torch::kLong : torch::kFloat;
  std::map<int64_t, at::Tensor> uploads;  // ordered: the sum runs in client order
  while (!round_can_close(static_cast<int64_t>(expected.size()), static_cast<int64_t>(uploads.size()),
                          f.min_clients, Clock::now() >= deadline)) {
    next_event(wait_until(), [&](Message& m) {
      if (m.kind == MessageKind::kUpdate && expected.count(m.client) && hosted_by(m.client, m.from)) {
        if (m.payload.defined() && m.payload.scalar_type() == want_type && m.payload.numel() == numel + 3) {
          uploads[m.client] = m.payload;
        } else {
          spdlog::warn("round {}: client {} (rank {}) sent a malformed update; dropped", round, m.client, m.from);
          report.failed.push_back(m.client);
        }
        expected.erase(m.client);
      } else if (m.kind == MessageKind::kRoundDone) {
        for (int64_t c : ids_of(m.payload)) {
          if (expected.erase(c)) report.failed.push_back(c);
        }
      }
    });
  }

  at::Tensor aggregate;
  if (f.secure_aggregation) {
    // Updates from a process that died before the close count as dropped:
    // the survivors' seeds remove their masks like any other dropout's.
    for (auto it = uploads.begin(); it != uploads.end();) {
      it = links_->alive(host_of(it->first)) ? std::next(it) : uploads.erase(it);
    }
    std::vector<int64_t> dropped_ids, dropped_index;
    for (size_t i = 0; i < secure_ids.size(); ++i) {
      if (!uploads.count(secure_ids[i])) {
        dropped_ids.push_back(secure_ids[i]);
        dropped_index.push_back(static_cast<int64_t>(i));
      }
    }
    for (int h : hosts) {
      if (!participants_of[h].empty())
        links_->post(h, Message{MessageKind::kClose, round, -1, ids_tensor(dropped_ids)});
    }
    const auto d = static_cast<int64_t>(dropped_ids.size());
    std::map<int64_t, std::vector<Key>> seeds_of;  // survivor -> its seed with each dropped participant
    if (d > 0) {
      for (const auto& [c, u] : uploads) answering.insert(host_of(c));
      for (int h : std::set<int>(answering)) {
        if (!links_->alive(h)) lose(h, links_->why(h));
      }
      // Recovery has no deadline: without every survivor's seeds the sum is noise.
      while (!answering.empty() && !recovery_failed) {
        next_event(Clock::now() + kIdleWait, [&](Message& m) {
          if (m.kind != MessageKind::kSeeds || !answering.count(m.from)) return;
          std::vector<int64_t> ids;
          std::vector<Key> seeds;
          read_key_rows(m.payload, d, ids, seeds);
          for (size_t i = 0; i < ids.size(); ++i)
            seeds_of[ids[i]] = std::vector<Key>(seeds.begin() + static_cast<int64_t>(i) * d,
                                                seeds.begin() + static_cast<int64_t>(i + 1) * d);
          answering.erase(m.from);
        });
      }
      for (const auto& [c, u] : uploads) {
        if (!recovery_failed && !seeds_of.count(c)) {
          spdlog::error("round {}: client {}'s host answered the recovery without its seeds", round, c);
          recovery_failed = true;
        }
      }
    }
    if (recovery_failed) {
      spdlog::error("round {}: a client process died during secure-aggregation recovery, so the masks of its "
                    "surviving clients cannot be removed: the round is skipped and the global model kept (a "
                    "survivor failing during recovery is not tolerated: docs/federated.md)",
                    round);
      uploads.clear();
    }
    at::Tensor sum = torch::zeros({numel + 3}, torch::kLong);
    for (const auto& [c, u] : uploads) add_mod(sum, u);
    for (size_t u = 0; u < secure_ids.size(); ++u) {
      auto it = seeds_of.find(secure_ids[u]);
      if (it == seeds_of.end() || !uploads.count(secure_ids[u])) continue;
      for (int64_t k = 0; k < d; ++k) remove_mask(sum, it->second[k], static_cast<int64_t>(u), dropped_index[k]);
    }
    aggregate = from_fixed_point(sum);
    report.secure_bytes_up = 32 + (numel + 3) * 4 + d * 32;
    report.secure_bytes_down = static_cast<int64_t>(secure_ids.size()) * 32;
  } else {
    auto sum = torch::zeros({numel + 3}, torch::kFloat);
    for (const auto& [c, u] : uploads) sum.add_(u);
    aggregate = sum.to(torch::kDouble);
  }

  // Why each participant without an update in the sum is missing.
  catch_up();
  for (int64_t c : participants) {
    if (uploads.count(c)) continue;
    report.dropped.push_back(c);
    if (std::binary_search(lost_ranks_.begin(), lost_ranks_.end(), host_of(c))) {
      report.lost.push_back(c);
    } else if (std::find(report.failed.begin(), report.failed.end(), c) == report.failed.end()) {
      report.late.push_back(c);
    }
  }
  std::sort(report.dropped.begin(), report.dropped.end());
  std::sort(report.failed.begin(), report.failed.end());
  if (!report.late.empty())
    spdlog::warn("round {}: closed at the deadline (federated.round_timeout_s = {}) with {} updates; clients "
                 "still training are dropped from the round: [{}]",
                 round, f.round_timeout_s, uploads.size(), fmt::join(report.late, ", "));
  apply_aggregate(report, aggregate);
  return report;
}

}  // namespace paratrain::federated

// A client host's side of a multi-process round (Note [Federated round] in
// round.h): wait for the server's round, train the participants it names,
// send each update as it is done. A host talks only to the server: if the
// server is gone, the host fails at once with CommError.
#include <signal.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/federated/client.h"
#include "paratrain/federated/round.h"
#include "paratrain/federated/secure_aggregation.h"

namespace paratrain::federated {
namespace {

[[noreturn]] void server_gone(int rank, const std::exception& e) {
  throw CommError(fmt::format("rank {}: lost the federated server (rank 0): {}. This client host stops; the "
                              "server's log says why it ended",
                              rank, e.what()));
}

void send_to_server(comm::ProcessGroup& world, const Message& m) {
  try {
    send_message(world, 0, m);
  } catch (const CommError& e) {
    server_gone(world.rank(), e);
  }
}

void expect(const Message& m, MessageKind kind, int64_t round, int rank) {
  if (m.kind != kind || m.round != round)
    throw CommError(fmt::format("rank {}: the federated server sent \"{}\" for round {} where \"{}\" for round {} "
                                "belongs; are server and clients the same paratrain version?",
                                rank, to_string(m.kind), m.round, to_string(kind), round));
}

int64_t index_in(const std::vector<int64_t>& sorted, int64_t id) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), id);
  return it != sorted.end() && *it == id ? it - sorted.begin() : -1;
}

}  // namespace

Message FederatedRun::receive_from_server() {
  try {
    return receive_message(world_, 0);
  } catch (const CommError& e) {
    server_gone(world_.rank(), e);
  }
}

RoundReport FederatedRun::host_round(int64_t round) {
  const auto& f = config_.federated;
  const int rank = world_.rank();
  RoundReport report;
  report.round = round;
  if (stopped_) return report;
  Message start = receive_from_server();
  if (start.kind == MessageKind::kStop) {
    stopped_ = true;
    return report;
  }
  // The server numbers the rounds (a resumed run starts past 1).
  round = start.round;
  report.round = round;
  expect(start, MessageKind::kRound, round, rank);
  const std::vector<int64_t> mine = ids_of(start.payload);  // ascending
  report.sampled = mine;  // a host sees only its own participants
  if (mine.empty()) {
    send_to_server(world_, Message{MessageKind::kRoundDone, round, -1, at::Tensor()});
    return report;
  }
  Message model = receive_from_server();
  expect(model, MessageKind::kModel, round, rank);
  TORCH_CHECK(model.payload.defined() && model.payload.numel() == global_.numel(), "the server's model has ",
              model.payload.defined() ? model.payload.numel() : 0, " values, this host's ", global_.numel());
  global_.copy_(model.payload);

  // Secure aggregation: fresh keys for this round's participants, then the
  // server's list of everyone's (a client missing from it was too late).
  const bool secure = f.secure_aggregation;
  std::map<int64_t, KeyPair> keys;
  std::vector<int64_t> keyed;
  std::vector<Key> public_keys;
  if (secure) {
    std::vector<Key> mine_public;
    for (int64_t c : mine) {
      keys[c] = make_key_pair();
      mine_public.push_back(keys[c].public_key);
    }
    send_to_server(world_, Message{MessageKind::kKeys, round, -1, key_rows(mine, mine_public, 1)});
    Message list = receive_from_server();
    expect(list, MessageKind::kKeyList, round, rank);
    read_key_rows(list.payload, 1, keyed, public_keys);
  }

  std::vector<int64_t> failed, uploaded;
  for (int64_t c : mine) {
    const int64_t index = secure ? index_in(keyed, c) : 0;
    if (index < 0) {
      report.dropped.push_back(c);  // its key missed the deadline: not a participant
      continue;
    }
    at::Tensor payload;
    try {
      at::Tensor upload = train_for_upload(c, round);
      payload = secure ? mask_vector(keys[c], index, public_keys, round, upload.to(torch::kDouble),
                                     static_cast<int64_t>(keyed.size()))
                       : upload;
    } catch (const std::exception& e) {
      spdlog::warn("round {}: client {} (rank {}) failed and is dropped from the round: {}", round, c, rank, e.what());
      failed.push_back(c);
      report.failed.push_back(c);
      report.dropped.push_back(c);
      continue;
    }
    send_to_server(world_, Message{MessageKind::kUpdate, round, c, payload});
    uploaded.push_back(c);
    if (f.test_kill_process_at_round == round && rank == world_.size() - 1) {
      // Fault injection (tests only): die as a crashed process would, with
      // the round half done and no goodbye.
      spdlog::warn("rank {}: federated.test_kill_process_at_round = {}: killing this process (SIGKILL)", rank, round);
      spdlog::default_logger()->flush();
      ::kill(::getpid(), SIGKILL);
    }
  }
  load_flat_parameters(*model_, global_);  // the model object leaves the round holding x_t again
  send_to_server(world_, Message{MessageKind::kRoundDone, round, -1, ids_tensor(failed)});

  if (secure) {
    // Recovery: reveal each surviving client's seed with every dropped one.
    Message close = receive_from_server();
    expect(close, MessageKind::kClose, round, rank);
    const std::vector<int64_t> dropped = ids_of(close.payload);
    std::vector<int64_t> survivors;
    std::vector<Key> seeds;
    if (!dropped.empty()) {
      for (int64_t c : uploaded) {
        if (std::find(dropped.begin(), dropped.end(), c) != dropped.end()) continue;
        survivors.push_back(c);
        for (int64_t v : dropped) {
          const int64_t vi = index_in(keyed, v);
          if (vi < 0) throw CommError(fmt::format("rank {}: the server dropped client {}, which had no key", rank, v));
          seeds.push_back(pairwise_seed(keys[c], public_keys[static_cast<size_t>(vi)], round));
        }
      }
    }
    send_to_server(world_, Message{MessageKind::kSeeds, round, -1,
                                   key_rows(survivors, seeds, static_cast<int64_t>(dropped.size()))});
  }
  for (auto& [c, k] : keys) wipe(k);
  return report;
}

}  // namespace paratrain::federated

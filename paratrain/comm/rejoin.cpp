// The membership round of in-job recovery (rejoin.h): keys, who closes the
// round, and the new group.
#include "paratrain/comm/rejoin.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string encode(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }

std::vector<int> decode(const std::vector<uint8_t>& bytes) {
  std::vector<int> out;
  std::string text(bytes.begin(), bytes.end());
  std::size_t at = 0;
  while (at < text.size()) {
    auto comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    out.push_back(std::stoi(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

// Note [Closing the membership round]
// Each survivor writes alive/<old rank>, then counts itself in "joined".
// Whoever first sees the round complete (old_size - 1 arrivals: the dead
// rank cannot come; or its own window over) takes the "closer" ticket; the
// one that gets ticket 1 lists the alive/ keys present and publishes
// "members". Everyone reads that one list, so all survivors agree even when
// a late one arrives after it was written (it is not in it and is told so).
// A counted arrival always has its alive/ key (written first), so nobody
// counted is left out by the closer.
void close_round(c10d::Store& store, int old_rank, int old_size, std::chrono::milliseconds window) {
  store.set(fmt::format("alive/{}", old_rank), std::vector<uint8_t>{'1'});
  store.add("joined", 1);
  const auto deadline = Clock::now() + window;
  for (;;) {
    if (store.check({"members"})) break;
    const int64_t joined = store.add("joined", 0);
    if (joined >= old_size - 1 || Clock::now() >= deadline) {
      if (store.add("closer", 1) == 1) {
        std::vector<int> members;
        for (int r = 0; r < old_size; ++r) {
          if (store.check({fmt::format("alive/{}", r)})) members.push_back(r);
        }
        const std::string text = encode(members);
        store.set("members", std::vector<uint8_t>(text.begin(), text.end()));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

std::vector<int> Membership::dead() const {
  std::vector<int> out;
  for (int r = 0; r < old_size; ++r) {
    if (!std::binary_search(survivors.begin(), survivors.end(), r)) out.push_back(r);
  }
  return out;
}

Rejoiner::Rejoiner(c10::intrusive_ptr<c10d::Store> store, std::string prefix, RejoinOptions options)
    : store_(std::move(store)), prefix_(std::move(prefix)), options_(std::move(options)) {}

Membership Rejoiner::rejoin(int old_rank, int old_size) {
  ++epoch_;
  auto round = c10::make_intrusive<c10d::PrefixStore>(fmt::format("{}/recovery{}", prefix_, epoch_), store_);
  Membership m;
  m.epoch = epoch_;
  m.old_rank = old_rank;
  m.old_size = old_size;
  try {
    close_round(*round, old_rank, old_size, options_.window);
    round->wait({"members"}, options_.gloo.timeout);
    m.survivors = decode(round->get("members"));
  } catch (const c10::Error& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw TimeoutError(fmt::format("rank {} of {}: in-job recovery {}: the membership round did not close ({}); "
                                   "is the store (served by rank 0 unless the launcher serves it) still alive?",
                                   old_rank, old_size, epoch_, msg));
  }
  auto mine = std::find(m.survivors.begin(), m.survivors.end(), old_rank);
  if (mine == m.survivors.end()) {
    throw CommError(fmt::format("rank {} of {}: in-job recovery {}: arrived after the survivors {} closed the "
                                "membership round without it; this rank is out of the job",
                                old_rank, old_size, epoch_, encode(m.survivors)));
  }
  m.rank = static_cast<int>(mine - m.survivors.begin());
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world", round);
  m.group = make_gloo_group(world_store, m.rank, static_cast<int>(m.survivors.size()), options_.gloo);
  return m;
}

}  // namespace paratrain::comm

// Rank check-in on a c10d store: see store_checkin.h.
#include "paratrain/comm/store_checkin.h"

#include <algorithm>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/compat.h"
#include "paratrain/core/error.h"
#include "paratrain/core/rank_list.h"

namespace paratrain::comm {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(20);

std::string abort_key(const std::string& key_prefix) { return key_prefix + "/abort"; }

}  // namespace

// Note [Ending a check-in]
// A rank that dies before every rank checked in leaves the others waiting
// for it until world.timeout_s (300 s by default), though the launcher saw
// the death at once. The launcher serves the store (launch/agent_store.h),
// so it writes the reason under "<prefix>/abort" and every rank polling the
// check-in stops with that reason instead. Ending is the answer rather than
// going on without the dead rank: before the world is built nothing is lost
// by stopping, and a smaller world than the one asked for would change the
// global batch and the data shards without anyone having chosen it. Under
// --keep-going the launch then fails (no rank succeeded) within a poll
// interval. The key lives under the generation's prefix, so a later
// generation's check-in never sees it; a check-in that completed never reads
// it again (in-job recovery's rounds use comm/rejoin.h, not this).
//
// A rank may also die after it checked in but before it published what its
// peers connect to (its Gloo address, its shared-memory segment's name):
// they then block in the backend's connection setup, in a store get() or
// wait() for its key. The backends see the job's store through
// ending_with_check_in(), whose blocking calls poll for the key and for the
// abort key alike, so that death ends their wait the same way. Sub-groups
// made later on that store would end too: a rank the launcher saw die
// cannot join them either.
//
// Arrival is polled in rank order with check() (non-blocking) rather than
// wait(), so that at the deadline we still know which ranks are missing; a
// rank known to have arrived is not asked about again, so a poll costs one
// store round trip while a rank is awaited, whatever the world size.
void check_in(c10d::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
              const std::string& where, const std::string& key_prefix) {
  auto key = [&](int r) { return fmt::format("{}/{}", key_prefix, r); };
  store.set(key(rank), std::vector<uint8_t>{1});

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int arrived = 0;  // ranks 0 .. arrived-1 have checked in
  while (true) {
    if (store.check({abort_key(key_prefix)})) {
      const auto why = store.get(abort_key(key_prefix));
      throw CheckInEnded(fmt::format("rank {}: the rendezvous ({}) was ended before every rank arrived: {}; this "
                                  "rank stops instead of waiting world.timeout_s for it",
                                  rank, where, std::string(why.begin(), why.end())));
    }
    while (arrived < world_size && store.check({key(arrived)})) ++arrived;
    if (arrived == world_size) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPoll);
  }
  std::vector<int> named;
  std::size_t missing = 0;
  for (int r = arrived; r < world_size; ++r) {
    if (store.check({key(r)})) continue;
    ++missing;
    if (named.size() < core::kNamedRanks) named.push_back(r);
  }
  if (missing == 0) return;  // the last ones arrived during the final pass
  throw TimeoutError(fmt::format(
      "rank {}: rank(s) {} of world size {} never arrived at the rendezvous ({}) within {} s. "
      "Check that every rank was started, with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE, "
      "or raise world.timeout_s",
      rank, core::capped_rank_list(named, missing), world_size, where,
      std::chrono::duration<double>(timeout).count()));
}

namespace {

// The job's store with get() and wait() that end on the check-in's abort key.
class EndingStore final : public c10d::Store {
 public:
  EndingStore(c10::intrusive_ptr<c10d::Store> inner, int rank, std::string where, std::string abort)
      : Store(inner->getTimeout()), inner_(std::move(inner)), rank_(rank), where_(std::move(where)),
        abort_(std::move(abort)) {}

  // LibTorch 2.11's Store declares clone() pure (a copy for another thread);
  // Debian's older one has none, hence no `override`.
  c10::intrusive_ptr<c10d::Store> clone() {  // NOLINT(modernize-use-override)
#if PARATRAIN_TORCH_AT_LEAST(2, 0)
    auto copy = c10::make_intrusive<EndingStore>(inner_->clone(), rank_, where_, abort_);
#else
    auto copy = c10::make_intrusive<EndingStore>(inner_, rank_, where_, abort_);
#endif
    copy->setTimeout(timeout_);
    return copy;
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key}, timeout_);
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  // Polls: at once, then every 1, 2, 4 ... up to kPoll ms, so keys that are
  // already there (the usual case) cost one round trip.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    while (!inner_->check(keys)) {
      if (inner_->check({abort_})) {
        const auto why = inner_->get(abort_);
        throw CheckInEnded(fmt::format("rank {}: the rendezvous ({}) was ended while this rank was connecting to "
                                    "its peers: {}; this rank stops instead of waiting world.timeout_s for it",
                                    rank_, where_, std::string(why.begin(), why.end())));
      }
      if (timeout.count() > 0 && std::chrono::steady_clock::now() >= deadline)
        throw TimeoutError(fmt::format("rank {}: waited {} s on the rendezvous ({}) for {} while connecting to "
                                       "its peers; a peer may have died or be stuck starting",
                                       rank_, std::chrono::duration<double>(timeout).count(), where_,
                                       keys.empty() ? std::string("nothing") : keys.front()));
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kPoll);
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
  int rank_;
  std::string where_;
  std::string abort_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> ending_with_check_in(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                     std::string where, const std::string& key_prefix) {
  return c10::make_intrusive<EndingStore>(std::move(store), rank, std::move(where), abort_key(key_prefix));
}

bool check_in_ended(c10d::Store& store, const std::string& key_prefix) {
  return store.check({abort_key(key_prefix)});
}

void abort_check_in(c10d::Store& store, const std::string& reason, const std::string& key_prefix) {
  store.set(abort_key(key_prefix), std::vector<uint8_t>(reason.begin(), reason.end()));
}

void end_check_in(const c10::intrusive_ptr<c10d::Store>& store, const std::string& run_id, int restart_count,
                  const std::string& reason) {
  WorldInfo generation;
  generation.run_id = run_id;
  generation.restart_count = restart_count;
  // The prefix init_process_group puts before check_in's keys.
  c10d::PrefixStore job_store(rendezvous_prefix(generation), store);
  abort_check_in(job_store, reason);
}

}  // namespace paratrain::comm

// Rank check-in on a c10d store: see store_checkin.h.
#include "paratrain/comm/store_checkin.h"

#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/core/error.h"

namespace paratrain::comm {

void check_in(c10d::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
              const std::string& where, const std::string& key_prefix) {
  auto key = [&](int r) { return fmt::format("{}/{}", key_prefix, r); };
  store.set(key(rank), std::vector<uint8_t>{1});

  // Poll with check() (non-blocking) rather than wait() so that at the
  // deadline we still know exactly which ranks are missing.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) missing.push_back(r);
  while (true) {
    std::vector<int> still;
    for (int r : missing) {
      if (!store.check({key(r)})) still.push_back(r);
    }
    missing.swap(still);
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw TimeoutError(fmt::format(
      "rank {}: rank(s) {} of world size {} never arrived at the rendezvous ({}) within {} s. "
      "Check that every rank was started, with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE, "
      "or raise world.timeout_s",
      rank, fmt::join(missing, ","), world_size, where,
      std::chrono::duration<double>(timeout).count()));
}

}  // namespace paratrain::comm

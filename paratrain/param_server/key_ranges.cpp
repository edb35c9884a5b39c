// Key-range partitioning: see key_ranges.h.
#include "paratrain/param_server/key_ranges.h"

#include <stdexcept>
#include <string>

namespace paratrain::param_server {

std::vector<KeyRange> KeyRangePlan::ranges_of(int server) const {
  std::vector<KeyRange> out;
  for (const auto& r : ranges)
    if (r.server == server) out.push_back(r);
  return out;
}

KeyRangePlan plan_key_ranges(const std::vector<int64_t>& numel, const std::vector<int64_t>& element_bytes,
                             int servers) {
  if (servers < 1) throw std::invalid_argument("plan_key_ranges: servers must be >= 1, got " + std::to_string(servers));
  if (numel.size() != element_bytes.size()) {
    throw std::invalid_argument("plan_key_ranges: numel and element_bytes differ in length");
  }
  int64_t total = 0;
  for (size_t i = 0; i < numel.size(); ++i) {
    if (numel[i] < 0 || element_bytes[i] < 1) {
      throw std::invalid_argument("plan_key_ranges: tensor " + std::to_string(i) + " has a negative size or an "
                                  "element size below one byte");
    }
    total += numel[i] * element_bytes[i];
  }
  KeyRangePlan plan;
  plan.servers = servers;
  plan.server_numel.assign(servers, 0);
  plan.server_bytes.assign(servers, 0);
  // Server s starts at byte boundary(s); an element belongs to the server
  // whose interval holds its first byte.
  auto boundary = [&](int s) { return total / servers * s + total % servers * s / servers; };
  auto owner = [&](int64_t byte) {
    int s = static_cast<int>(byte * servers / std::max<int64_t>(total, 1));
    while (s + 1 < servers && boundary(s + 1) <= byte) ++s;
    while (s > 0 && boundary(s) > byte) --s;
    return s;
  };
  int64_t byte = 0;  // key-space byte offset of the current tensor's first element
  for (size_t i = 0; i < numel.size(); ++i) {
    const int64_t eb = element_bytes[i];
    int64_t e = 0;
    while (e < numel[i]) {
      const int s = owner(byte + e * eb);
      // The first element of this tensor that belongs to a later server.
      int64_t end = numel[i];
      if (s + 1 < servers) {
        const int64_t next = boundary(s + 1) - byte;  // bytes into this tensor where s+1 begins
        if (next < end * eb) end = std::max(e + 1, (next + eb - 1) / eb);
      }
      plan.ranges.push_back({static_cast<int>(i), e, end, s});
      plan.server_numel[s] += end - e;
      plan.server_bytes[s] += (end - e) * eb;
      e = end;
    }
    byte += numel[i] * eb;
  }
  return plan;
}

}  // namespace paratrain::param_server

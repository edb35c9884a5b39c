// Buckets of key ranges: see bucket_plan.h and Note [Parameter-server buckets].
#include "paratrain/param_server/bucket_plan.h"

#include <stdexcept>
#include <string>

namespace paratrain::param_server {

int64_t BucketPlan::messages() const {
  int64_t n = 0;
  for (const auto& server : buckets) n += static_cast<int64_t>(server.size());
  return n;
}

BucketPlan plan_buckets(const KeyRangePlan& plan, const std::vector<int>& group,
                        const std::vector<int64_t>& element_bytes, int64_t cap_bytes) {
  if (cap_bytes < 0) throw std::invalid_argument("plan_buckets: negative cap " + std::to_string(cap_bytes));
  auto unit_of = [&](const KeyRange& r) {
    if (group.empty()) return r.tensor;
    if (r.tensor < 0 || static_cast<size_t>(r.tensor) >= group.size()) {
      throw std::invalid_argument("plan_buckets: no group for tensor " + std::to_string(r.tensor));
    }
    return group[r.tensor];
  };
  auto bytes_of = [&](const KeyRange& r) {
    if (r.tensor < 0 || static_cast<size_t>(r.tensor) >= element_bytes.size()) {
      throw std::invalid_argument("plan_buckets: no element size for tensor " + std::to_string(r.tensor));
    }
    return r.numel() * element_bytes[r.tensor];
  };
  BucketPlan out;
  out.buckets.resize(plan.servers);
  out.bucket_of.resize(plan.servers);
  for (int s = 0; s < plan.servers; ++s) {
    const auto ranges = plan.ranges_of(s);
    auto& buckets = out.buckets[s];
    const int n = static_cast<int>(ranges.size());
    for (int k = 0; k < n;) {
      // The unit starting at k: the neighbours that belong to the same layer.
      int end = k + 1;
      if (cap_bytes > 0) {
        while (end < n && unit_of(ranges[end]) == unit_of(ranges[k])) ++end;
      }
      int64_t numel = 0, bytes = 0;
      for (int j = k; j < end; ++j) {
        numel += ranges[j].numel();
        bytes += bytes_of(ranges[j]);
      }
      // Merged into the open bucket when both fit under the cap together.
      if (cap_bytes > 0 && !buckets.empty() && buckets.back().bytes + bytes <= cap_bytes) {
        auto& b = buckets.back();
        b.last = end;
        b.numel += numel;
        b.bytes += bytes;
      } else {
        buckets.push_back({s, k, end, numel, bytes});
      }
      k = end;
    }
    for (int b = 0; b < static_cast<int>(buckets.size()); ++b) {
      for (int k = buckets[b].first; k < buckets[b].last; ++k) out.bucket_of[s].push_back(b);
    }
  }
  return out;
}

}  // namespace paratrain::param_server

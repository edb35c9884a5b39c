// StepStats: see step_stats.h.
#include "paratrain/data_parallel/ddp/step_stats.h"

#include <algorithm>
#include <utility>

namespace paratrain::ddp {
namespace {

// Union of the buckets' in-flight intervals, clipped to [from, to), in ms.
// Buckets complete in launch order on one group, but a backend may overlap
// them, so intervals are merged rather than summed.
double in_flight_ms(const std::vector<BucketTiming>& buckets, double from, double to) {
  std::vector<std::pair<double, double>> spans;
  for (const BucketTiming& b : buckets) {
    if (b.launched_ms < 0 || b.completed_ms < 0) continue;
    const double lo = std::max(b.launched_ms, from);
    const double hi = std::min(b.completed_ms, to);
    if (hi > lo) spans.emplace_back(lo, hi);
  }
  std::sort(spans.begin(), spans.end());
  double total = 0;
  double cur_lo = 0;
  double cur_hi = -1;
  for (const auto& [lo, hi] : spans) {
    if (lo > cur_hi) {
      if (cur_hi > cur_lo) total += cur_hi - cur_lo;
      cur_lo = lo;
      cur_hi = hi;
    } else {
      cur_hi = std::max(cur_hi, hi);
    }
  }
  if (cur_hi > cur_lo) total += cur_hi - cur_lo;
  return total;
}

constexpr double kForever = 1e300;

}  // namespace

double StepStats::comm_ms() const { return in_flight_ms(buckets, 0, kForever); }

double StepStats::hidden_ms() const { return in_flight_ms(buckets, 0, backward_ms); }

double StepStats::hidden_share() const {
  const double total = comm_ms();
  return total > 0 ? hidden_ms() / total : 0.0;
}

}  // namespace paratrain::ddp

// plan_buckets(): see bucket_plan.h and Note [Bucket order] in docs/notes/ddp.md.
#include "paratrain/data_parallel/ddp/bucket_plan.h"

#include <algorithm>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

void validate(const BucketPlanOptions& o) {
  if (o.bucket_cap_bytes <= 0) {
    throw ConfigError(fmt::format("bucket_cap_bytes = {}: must be > 0 (c10d uses 25 MiB)",
                                  o.bucket_cap_bytes));
  }
  if (o.first_bucket_cap_bytes <= 0) {
    throw ConfigError(fmt::format(
        "first_bucket_cap_bytes = {}: must be > 0 (set it equal to bucket_cap_bytes to "
        "disable the smaller first bucket)",
        o.first_bucket_cap_bytes));
  }
  if (o.pad_to_multiple < 1) {
    throw ConfigError(fmt::format("pad_to_multiple = {}: must be >= 1 (1 = no padding)",
                                  o.pad_to_multiple));
  }
}

// A bucket still accepting parameters; one per (dtype, device).
struct OpenBucket {
  BucketPlan plan;
  int64_t bytes = 0;
  std::size_t closed_before = 0;  // buckets of this (dtype, device) already closed
  std::size_t last_position = 0;  // position of the newest parameter in the walk
};

struct ClosedBucket {
  std::size_t last_position;  // when its last gradient becomes ready
  BucketPlan plan;
};

}  // namespace

// The walk goes from the last registered parameter to the first: autograd
// produces gradients roughly in that order, so a bucket filled from this walk
// completes early in backward. Each (dtype, device) has its own open bucket,
// closed when it reaches its cap (the first one of each key uses the smaller
// first cap). Buckets are then sorted by the position of their *last*
// parameter in the walk, i.e. by when they are expected to be complete, which
// is the order they are launched in.
std::vector<BucketPlan> plan_buckets(const std::vector<ParamSpec>& params,
                                     const BucketPlanOptions& options) {
  validate(options);
  std::vector<OpenBucket> open;
  std::vector<ClosedBucket> closed;

  auto close = [&](OpenBucket& b) {
    BucketPlan& p = b.plan;
    const int64_t m = options.pad_to_multiple;
    p.padded_numel = (p.numel + m - 1) / m * m;
    const at::ScalarType dtype = p.dtype;
    const at::Device device = p.device;
    closed.push_back({b.last_position, std::move(p)});
    b.plan = BucketPlan{dtype, device, {}, {}, 0, 0};
    b.bytes = 0;
    ++b.closed_before;
  };

  std::size_t position = 0;
  for (std::size_t k = params.size(); k-- > 0; ++position) {
    const ParamSpec& spec = params[k];
    if (spec.numel < 0) {
      throw ConfigError(fmt::format("parameter {} has numel {} < 0", k, spec.numel));
    }
    auto it = std::find_if(open.begin(), open.end(), [&](const OpenBucket& b) {
      return b.plan.dtype == spec.dtype && b.plan.device == spec.device;
    });
    if (it == open.end()) {
      open.push_back(OpenBucket{BucketPlan{spec.dtype, spec.device, {}, {}, 0, 0}});
      it = std::prev(open.end());
    }
    OpenBucket& b = *it;
    b.plan.params.push_back(k);
    b.plan.offsets.push_back(b.plan.numel);
    b.plan.numel += spec.numel;
    b.bytes += spec.numel * static_cast<int64_t>(c10::elementSize(spec.dtype));
    b.last_position = position;
    const int64_t cap =
        b.closed_before == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    // A parameter larger than the cap ends up alone in its bucket.
    if (b.bytes >= cap) close(b);
  }
  for (OpenBucket& b : open) {
    if (!b.plan.params.empty()) close(b);
  }

  std::sort(closed.begin(), closed.end(), [](const ClosedBucket& a, const ClosedBucket& b) {
    return a.last_position < b.last_position;
  });
  std::vector<BucketPlan> out;
  out.reserve(closed.size());
  for (ClosedBucket& c : closed) out.push_back(std::move(c.plan));
  return out;
}

// Packed back to back (no gaps) because the sinks derive shard layouts from
// (offset, numel) alone: ZeRO-2's rank r owns elements [r, r+1) * padded/W of
// the buffer, whatever parameters fall there.
void validate_plans(const std::vector<BucketPlan>& plans, const std::vector<ParamSpec>& params) {
  std::vector<int> seen_in(params.size(), -1);
  for (std::size_t b = 0; b < plans.size(); ++b) {
    const BucketPlan& plan = plans[b];
    TORCH_CHECK(!plan.params.empty(), "bucket plan ", b, " is empty; drop it");
    TORCH_CHECK(plan.params.size() == plan.offsets.size(), "bucket plan ", b, " has ", plan.params.size(),
                " parameters but ", plan.offsets.size(), " offsets");
    int64_t end = 0;
    for (std::size_t k = 0; k < plan.params.size(); ++k) {
      const std::size_t p = plan.params[k];
      TORCH_CHECK(p < params.size(), "bucket plan ", b, " names parameter ", p, " of only ", params.size());
      TORCH_CHECK(seen_in[p] < 0, "parameter ", p, " is in bucket plans ", seen_in[p], " and ", b,
                  "; each parameter belongs to exactly one bucket");
      seen_in[p] = static_cast<int>(b);
      TORCH_CHECK(params[p].dtype == plan.dtype && params[p].device == plan.device, "bucket plan ", b,
                  " holds ", plan.dtype, " on ", plan.device, " but its parameter ", p, " is ", params[p].dtype,
                  " on ", params[p].device, "; a bucket holds one dtype on one device");
      TORCH_CHECK(plan.offsets[k] == end, "bucket plan ", b, ": parameter ", p, " (slot ", k, ") is at offset ",
                  plan.offsets[k], ", expected ", end, " (parameters are packed back to back in slot order)");
      end += params[p].numel;
    }
    TORCH_CHECK(plan.numel == end, "bucket plan ", b, " says numel ", plan.numel, " but its parameters hold ",
                end, " elements");
    TORCH_CHECK(plan.padded_numel >= plan.numel, "bucket plan ", b, " has padded_numel ", plan.padded_numel,
                " < numel ", plan.numel);
  }
  for (std::size_t p = 0; p < params.size(); ++p) {
    TORCH_CHECK(seen_in[p] >= 0, "parameter ", p, " is in no bucket plan; every parameter must be in one");
  }
}

}  // namespace paratrain::ddp

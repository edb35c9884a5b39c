// Bucket assignment: which parameters' gradients share one flat buffer, and in
// which order the buffers are communicated. Pure logic on shapes and dtypes,
// no tensors and no communication, so DDP's all-reduce and (later) ZeRO/FSDP's
// reduce-scatter into shards plan their buckets the same way.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace paratrain::ddp {

// What the planner needs to know about one parameter.
struct ParamSpec {
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
};

/// c10d's bucket sizes (PyTorch's bucket_cap_mb = 25 and its 1 MiB first
/// bucket): the defaults of BucketPlanOptions and of the [ddp] config section.
inline constexpr int64_t kDefaultBucketCapBytes = 25LL * 1024 * 1024;
inline constexpr int64_t kDefaultFirstBucketCapBytes = 1LL * 1024 * 1024;

struct BucketPlanOptions {
  // Size cap of every bucket but the first of each dtype, in bytes. Bigger
  // buckets mean fewer collectives (each pays a fixed latency, ~50-100 us over
  // Gloo/TCP) but less overlap: a bucket cannot start before its last gradient
  // exists, and the final bucket's communication is never hidden. c10d: 25 MiB.
  int64_t bucket_cap_bytes = kDefaultBucketCapBytes;
  // Cap of the first bucket (the gradients backward produces first, i.e. of
  // the last layers). Small so communication starts early in backward; too
  // small adds one latency-bound collective. c10d: 1 MiB.
  int64_t first_bucket_cap_bytes = kDefaultFirstBucketCapBytes;
  // Round each bucket's element count up to a multiple of this (zero padding
  // at the end). 1 for all-reduce; the group size for reduce-scatter, so the
  // buffer splits into equal shards (ZeRO-2/3, FSDP).
  int64_t pad_to_multiple = 1;
};

// One bucket: parameters (indices into the planner's input) laid out back to
// back in one flat buffer of a single dtype and device.
struct BucketPlan {
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<std::size_t> params;  // in the order backward produces them
  std::vector<int64_t> offsets;     // element offset of each of `params`
  int64_t numel = 0;                // elements used by parameters
  int64_t padded_numel = 0;         // buffer length (>= numel)
};

// Assigns `params` (in registration order) to buckets, walking them in
// reverse: see Note [Bucket order] in docs/notes/ddp.md. The result is ordered
// by launch: bucket i is communicated before bucket i+1 on every rank. Every
// parameter appears in exactly one bucket. Deterministic: ranks with the same
// model get the same plan without talking to each other.
// Throws ConfigError when an option is out of range.
std::vector<BucketPlan> plan_buckets(const std::vector<ParamSpec>& params,
                                     const BucketPlanOptions& options = {});

// Checks plans built by hand (ReducerOptions::plans: FSDP's bucket per
// wrapping unit) against the parameters they index: every parameter in
// exactly one bucket; no empty bucket; each bucket's parameters packed back to
// back from offset 0 in the listed order (offsets[k+1] = offsets[k] +
// numel of params[k], numel = the total); padded_numel >= numel; every
// parameter of a bucket has the bucket's dtype and device. Throws c10::Error
// (TORCH_CHECK: a caller's mistake) naming the bucket and the parameter.
void validate_plans(const std::vector<BucketPlan>& plans, const std::vector<ParamSpec>& params);

}  // namespace paratrain::ddp

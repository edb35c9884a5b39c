// Buckets of key ranges: which of a server's key ranges travel together in
// one push message and one reply message. A server's ranges (KeyRangePlan::
// ranges_of order) are cut into runs of neighbours; a run is one message
// each way per step, so a layer's small tensors (biases, norms) share the
// message of its weight instead of travelling alone.
//
// Note [Parameter-server buckets]
// The unit is a layer's ranges on a server: the ranges of the tensors that
// one layer of the forward is the first to read (what the layer-wise pull
// waits for before that layer runs, Note [Pulling during the forward] in
// train/strategies/ps_strategy.cpp), or one tensor's range for a model
// without layers. Units are never split, so a layer never waits for two
// messages of one server; neighbouring units are merged while the bucket
// stays within the cap (ps.bucket_kb), which trades the later layer's share
// of the forward overlap for one message less. A unit larger than the cap is
// a bucket by itself. Cap 0 keeps one message per range (the protocol before
// buckets). The plan is pure and deterministic: every rank computes the
// same from the shapes, the model's layers and the cap, so the tags
// (push_tag / reply_tag of the bucket index) match on both ends.
#pragma once

#include <cstdint>
#include <vector>

#include "paratrain/param_server/key_ranges.h"

namespace paratrain::param_server {

// Ranges [first, last) of ranges_of(server), back to back in one message.
struct Bucket {
  int server = 0;
  int first = 0;
  int last = 0;
  int64_t numel = 0;  // elements of its ranges
  int64_t bytes = 0;  // their bytes
  int size() const { return last - first; }
  bool operator==(const Bucket&) const = default;
};

struct BucketPlan {
  // Per server, its buckets in range order: they cover its ranges once each.
  std::vector<std::vector<Bucket>> buckets;
  // Per server, per range (ranges_of order): the index of its bucket.
  std::vector<std::vector<int>> bucket_of;
  // Buckets over all servers: the push (and reply) messages of one step.
  int64_t messages() const;
};

// `group[t]`: the unit tensor t belongs to (the layer that first reads it);
// empty: each tensor is its own unit. `element_bytes[t]`: as given to
// plan_key_ranges. `cap_bytes` 0: one bucket per range. Throws
// std::invalid_argument for mismatched lengths or a negative cap.
BucketPlan plan_buckets(const KeyRangePlan& plan, const std::vector<int>& group,
                        const std::vector<int64_t>& element_bytes, int64_t cap_bytes);

}  // namespace paratrain::param_server

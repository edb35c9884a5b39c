// Key-range partitioning: which parameter server owns which elements. All
// parameters, in model order, form one key space (their flattened elements
// back to back); it is cut into S contiguous ranges of near-equal bytes, so a
// large tensor is split across servers and server bandwidth scales with S.
// Pure and deterministic: every rank computes the same plan from the shapes.
#pragma once

#include <cstdint>
#include <vector>

namespace paratrain::param_server {

// One run of a tensor's flattened elements, [begin, end), owned by `server`.
struct KeyRange {
  int tensor = 0;  // index into the list the plan was built from
  int64_t begin = 0;
  int64_t end = 0;
  int server = 0;
  int64_t numel() const { return end - begin; }
  bool operator==(const KeyRange&) const = default;
};

struct KeyRangePlan {
  int servers = 0;
  // Every non-empty range, in key order (tensor, then offset): the ranges of
  // server s are those with server == s, and that order is the order of
  // their elements in every message to or from s.
  std::vector<KeyRange> ranges;
  // Elements and bytes each server owns.
  std::vector<int64_t> server_numel;
  std::vector<int64_t> server_bytes;

  std::vector<KeyRange> ranges_of(int server) const;
};

// Cuts the tensors (numel[i] elements of element_bytes[i] bytes each) over
// `servers` servers: server s owns the elements whose first byte lies in
// [s * B / S, (s + 1) * B / S) of the B bytes in all, so loads differ by at
// most one element's bytes. Throws std::invalid_argument for servers < 1,
// negative sizes or element sizes < 1.
KeyRangePlan plan_key_ranges(const std::vector<int64_t>& numel, const std::vector<int64_t>& element_bytes,
                             int servers);

}  // namespace paratrain::param_server

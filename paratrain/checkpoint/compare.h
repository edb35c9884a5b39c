// Comparing two checkpoints tensor by tensor, behind `paratrain checkpoint
// compare A B`: the check every strategy uses ("consolidate, compare with a
// one-process run"). Reads only; not a loader, and not a test framework.
//
// A and B are each a sharded step directory or a single safetensors file (a
// consolidated checkpoint or save_checkpoint's); both are read through
// ShardedReader, so a directory is verified (sizes, checksums, coverage) as
// when loading. B is the reference: the relative difference of a tensor is
// max|a - b| / max(max|b|, tiny), one number per tensor, so a perturbation
// of one element is measured against the tensor's scale, not against that
// element (which may be near zero in a healthy run).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace paratrain::checkpoint {

struct CompareOptions {
  // Largest relative difference (see above) a tensor may have and still
  // agree. 1e-5 is the float32 oracle tolerance of the strategy tests
  // (reduction order differs between ranks and one process); looser hides
  // real bugs, tighter flags sums taken in another order.
  double rtol = 1e-5;
  // Only tensor names starting with this are compared (names outside it are
  // ignored on both sides). "model/" (the parameters and buffers) because
  // optimizer state often differs legitimately (e.g. a strategy that keeps
  // Adam's moments in another dtype); "optimizer/" or "" to look elsewhere.
  std::string prefix = "model/";
  // Compare every tensor, prefix ignored: model, optimizer state and rng/cpu
  // (the RNG state only agrees when both runs drew the same numbers).
  bool all = false;
};

struct TensorDiff {
  std::string name;
  std::vector<int64_t> shape;
  double max_abs = 0;  // max |a - b| over elements; NaN if either side has one
  double rel = 0;      // max_abs / max(max|b|, tiny)
  bool ok = false;     // rel <= rtol (NaN never is)
};

struct CompareReport {
  double rtol = 0;                        // the tolerance `ok` was judged by
  std::vector<TensorDiff> diffs;          // compared tensors, by name
  std::vector<std::string> only_in_a;     // names (under the prefix) B lacks
  std::vector<std::string> only_in_b;
  std::vector<std::string> mismatched;    // "name: A is F32 [5, 7], B is F32 [7, 5]"

  // Every compared tensor within rtol, the same names on both sides, no
  // shape or dtype mismatch, and at least one tensor compared (a prefix that
  // matches nothing is not agreement).
  bool ok() const;
  // The table (name, shape, max abs diff, rel diff, OK/DIFF), the names that
  // differ, and a last summary line: "N tensors compared, worst relative
  // difference X (name) — within|exceeds rtol R", plus "; names differ
  // (listed above)" when names, shapes or dtypes disagree.
  std::string format() const;
};

// Reads both checkpoints whole and compares them by tensor name. Throws
// CheckpointError naming the path that is missing, unreadable or damaged;
// TORCH_CHECK on a negative rtol.
CompareReport compare_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b,
                                  const CompareOptions& options = {});

}  // namespace paratrain::checkpoint

// Measurement kernels of the communication benchmarks, shared by the CLI's
// `paratrain bench comm` (apps/paratrain/bench_command.cpp) and the
// bench/allreduce_bandwidth program: one all-reduce per size on a group,
// nothing else running, next to a local memcpy of the same bytes measured in
// the same process. Not a driver (which backends, which processes): callers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/comm/process_group.h"

namespace paratrain::bench {

struct AllReduceBenchOptions {
  /// Bytes per all-reduce (float32 elements: bytes / 4, at least 1).
  std::vector<int64_t> sizes_bytes{4096, 1 << 20, 16 << 20, 64 << 20};
  /// Timed all-reduces per size at least; small sizes get more (up to
  /// max_iters, about 256 MiB moved per size) so a latency is a median of
  /// many. The median of the slowest rank's times is reported.
  int iters = 20;
  int max_iters = 200;
  int warmup = 3;  ///< untimed all-reduces per size first
  /// What crosses the wire: "fp32" (the backend's all-reduce), "bf16"
  /// (comm/low_precision_all_reduce.h) or "int8" (ddp/int8_all_reduce.h,
  /// with error feedback as DDP's hook runs it): the collective a gradient
  /// bucket takes under precision.comm_dtype / ddp.compression.
  std::string wire = "fp32";
};

/// One size's figures.
struct AllReduceRow {
  int64_t bytes = 0;
  int iters = 0;
  double ms = 0;           ///< median all-reduce time (slowest rank)
  double algbw_gb_s = 0;   ///< bytes / time
  double busbw_gb_s = 0;   ///< algbw x 2(n-1)/n: what each rank sends in a ring (0 on one rank)
  double memcpy_ms = 0;    ///< median local copy of the same bytes
  double memcpy_gb_s = 0;  ///< bytes / memcpy time (copy bandwidth, not read+write traffic)
  /// The tensor came from the group's symmetric memory (allocate_symmetric:
  /// shm reduces it in place); false: ordinary memory.
  bool symmetric = false;
  std::string wire = "fp32";  ///< as AllReduceBenchOptions::wire
};

/// Collective over `group`: times a float32 sum all-reduce per size; every
/// rank returns the same rows. Each timed iteration starts at a barrier and
/// takes the slowest rank's time, so a late rank does not make another's
/// all-reduce look slow. A backend with symmetric memory (shm) gets a second
/// row per size, the same all-reduce of a tensor from allocate_symmetric().
std::vector<AllReduceRow> bench_all_reduce(comm::ProcessGroup& group, const AllReduceBenchOptions& options);

/// {"bytes", "ms", "latency_us", "algbw_gb_s", "busbw_gb_s", "memcpy_gb_s",
/// "busbw_over_memcpy", ...}: one row as bench output prints it.
nlohmann::json to_json(const AllReduceRow& row);

}  // namespace paratrain::bench

// The DDP throughput measurement shared by `paratrain bench ddp`
// (apps/paratrain/bench_command.cpp, with --sweep-bucket-mb) and the
// bench/ddp_throughput program: trains the MLP or the CNN on synthetic
// in-memory batches with plain SGD under the bucketed DDP, its naive twin,
// no data parallelism ("local") or DDP without the all-reduce ("nocomm",
// the ceiling if communication were free; it trains replicas apart and is
// for analysis only), and reports samples/s with the reducer's timings.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/bucket_plan.h"

namespace paratrain::bench {

struct DdpBenchOptions {
  std::string model = "mlp";     ///< mlp: 784-1024-1024-10; cnn: models::CnnOptions{} (28x28x1); gpt: 4 layers, d 256, seq 128
  std::string mode = "bucketed"; ///< bucketed, naive, local (1 rank) or nocomm
  int steps = 200;               ///< timed steps
  int warmup = 20;               ///< untimed steps first (allocator, BLAS buffers, sockets)
  int batch = 64;                ///< examples per rank and step
  double lr = 0.01;              ///< plain SGD, no momentum
  double bucket_cap_mb = ddp::kDefaultBucketCapBytes / double(1 << 20);  ///< MiB, as PyTorch's bucket_cap_mb
  double first_bucket_cap_mb = ddp::kDefaultFirstBucketCapBytes / double(1 << 20);  ///< MiB, PyTorch's fixed first bucket
  bool gradient_as_bucket_view = false;
  /// ReducerOptions::symmetric_buffers: bucket buffers in the backend's
  /// symmetric memory (shm: the all-reduce reads them in place).
  bool symmetric_buffers = true;
  uint64_t seed = 0;             ///< seeds the model, and each rank's data (+ rank)
  /// none, fp16/bf16 (16-bit wire, fp32 sums) or powersgd (rank-r factors).
  std::string compression = "none";
  int64_t powersgd_rank = 1;
};

/// Throws ConfigError naming the flag when an option is out of range.
void validate(const DdpBenchOptions& options);

/// Collective over `group` (its backend is the one measured): builds the
/// model and the wrapper, runs warmup then timed steps, and returns the
/// result on every rank (rank 0's phase timings; the slowest rank's time):
/// {"samples_per_s", "step_ms", "bucket_cap_mb", "phase_ms", "comm", ...}.
nlohmann::json run_ddp_bench(comm::ProcessGroup& group, const DdpBenchOptions& options);

}  // namespace paratrain::bench

// [ddp], [parallel], [zero] and [pipeline]: the SPMD strategies and how the world is cut into axes.
// The sections of TrainConfig (config.h) that configure data_parallel/ (ddp, zero, fsdp), pipeline/, tensor_parallel/, sequence_parallel/ through train/strategies/.
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in parallel_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/data_parallel/ddp/bucket_plan.h"
#include "paratrain/data_parallel/fsdp/unit_plan.h"

namespace paratrain::train {

/// `[ddp]`: DistributedDataParallel's options (data_parallel/ddp/ddp.h).
struct DdpConfig {
  std::string mode = "bucketed";  ///< "bucketed" | "naive" | "none"
  double bucket_cap_mb = ddp::kDefaultBucketCapBytes / double(1 << 20);  ///< gradients per all-reduce bucket, in MiB
  double first_bucket_cap_mb = ddp::kDefaultFirstBucketCapBytes / double(1 << 20);  ///< small first bucket: its all-reduce starts early
  bool find_unused_parameters = false;  ///< allow parameters the loss did not reach (as in PyTorch)
  bool broadcast_buffers = true;        ///< rank 0's buffers (BatchNorm statistics) before each forward
  /// Gradient compression on the bucketed all-reduce: "none", "fp16"/"bf16"
  /// (as precision.comm_dtype: 16-bit wire, fp32 sums), "int8"
  /// (data_parallel/ddp/int8_all_reduce.h: int8 blocks, error feedback) or
  /// "powersgd" (data_parallel/ddp/powersgd.h: rank-r factors with error
  /// feedback).
  std::string compression = "none";
  int64_t powersgd_rank = 1;        ///< PowerSGD: rank r of the factors
  int64_t powersgd_start_step = 0;  ///< synchronized steps sent uncompressed first

  bool operator==(const DdpConfig&) const = default;
};

/// How the world is cut into parallel axes; dp * tp * pp * cp == world size.
struct ParallelConfig {
  int64_t dp = 0;  ///< data-parallel replicas; 0 = world / (tp * pp * cp)
  int64_t tp = 1;  ///< tensor parallel
  int64_t pp = 1;  ///< pipeline stages
  int64_t cp = 1;  ///< context (sequence) parallel: ring self-attention over cp ranks
  /// Expert parallelism inside dp: every MoE layer's experts split over
  /// groups of ep data-parallel ranks, tokens routed by all-to-all
  /// (moe/expert_parallel.h); must divide dp and the experts. Not an axis of
  /// the world: dp * tp * pp * cp == world as without it.
  int64_t ep = 1;
  /// Megatron sequence parallelism inside the tp group: LayerNorm, dropout and
  /// residuals run on 1/tp of the sequence (needs tp > 1): the GPT, or a
  /// planned model whose plan names its norms sequence_parallel.
  bool megatron_sp = false;
  /// Tensor parallelism for a model other than the GPT (whose plan is built
  /// in): "PATTERN=STYLE" entries, or a [parallel.tp_plan] table of
  /// "PATTERN" = "STYLE" (parallelize/plan.h: colwise, colwise[parts=N],
  /// colwise[gather], rowwise, vocab_embedding, sequence_parallel,
  /// replicate). Patterns match module names ("blocks.*.mlp.fc").
  std::vector<std::string> tp_plan;

  bool operator==(const ParallelConfig&) const = default;
};

/// ZeRO (arXiv 1910.02054) over the dp group: 0 = DDP (full replicas),
/// 1 = optimizer state sharded, 2 = + gradients, 3 = + parameters (FSDP).
struct ZeroConfig {
  int64_t stage = 0;  ///< 0, 1, 2 or 3
  /// Stage 3: a wrapping unit closes once it holds at least this many
  /// parameter elements (walking the model's children in order).
  int64_t unit_min_params = fsdp::kDefaultUnitMinParams;
  /// Stage 3: comma-separated names of child modules ("fc0,fc1"), each its own
  /// unit, the rest in a root unit. Overrides unit_min_params when not empty.
  std::string unit_modules;
  /// Stage 3: free a unit's gathered parameters after its forward and gather
  /// them again for backward (less memory), or keep them until backward.
  bool reshard_after_forward = true;
  /// Stage 3: start the next unit's all-gather while this one computes.
  bool prefetch = true;
  /// "none" or "cpu": ZeRO-1/2/3's optimizer state and step in host memory
  /// for GPU training (ZeRO-Offload); a CUDA build with world.device = cuda.
  std::string offload = "none";

  bool operator==(const ZeroConfig&) const = default;
};

/// Pipeline parallelism (parallel.pp > 1): the model's layers are cut into
/// pp * virtual_stages chunks; micro-batches flow through them by a schedule.
struct PipelineConfig {
  /// "gpipe" (all forwards, then all backwards: m micro-batches of activations
  /// alive), "1f1b" (same bubble, at most pp alive), "interleaved_1f1b"
  /// (virtual_stages chunks per rank: bubble / virtual_stages, more messages).
  std::string schedule = "1f1b";
  /// Micro-batches per step; must divide the per-replica batch. More: a
  /// smaller bubble ((pp-1)/(m+pp-1)) but smaller, less efficient kernels.
  int64_t microbatches = 4;
  /// Model chunks per rank for interleaved_1f1b (>= 2); 1 otherwise.
  int64_t virtual_stages = 1;
  /// Layers per chunk, e.g. [5, 3]; empty = balanced by `balance`.
  std::vector<int64_t> split;
  /// How empty `split` balances chunks: "parameters" (parameter count),
  /// "time" (forward+backward of each layer, measured on every rank, the
  /// minimum taken) or "rank_speed" (those times, each stage's chunks
  /// weighted by its ranks' measured speed: Note [Stages by rank speed]).
  std::string balance = "parameters";
  /// Recompute each chunk's forward during its backward: activations of a
  /// micro-batch shrink to the chunk's input, for one more forward per step.
  bool checkpoint_activations = false;
  /// Steps recorded in `<run>/trace/rank_<r>.jsonl` for `paratrain trace`
  /// (0 = none); the first steps of each process.
  int64_t trace_steps = 20;

  bool operator==(const PipelineConfig&) const = default;
};

}  // namespace paratrain::train

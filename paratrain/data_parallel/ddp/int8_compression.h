// ddp.compression = "int8" as a reducer's comm hook (DDP, ZeRO-1) or as the
// collective of ZeRO-2's reduce-scatter sink: the int8 gradient wire of
// int8_all_reduce.h (Note [The int8 gradient wire]) plus its error-feedback
// residuals per bucket, which travel in checkpoints (Note [Int8 wire state
// in checkpoints] in int8_compression.cpp).
//
//   auto int8 = std::make_shared<ddp::Int8Compression>();
//   ddp::DdpOptions options;
//   options.reducer.comm_hook = int8->hook();
//   ddp::DistributedDataParallel ddp(model, group, options);
//   int8->attach(ddp.reducer());  // learns the buckets' parameters
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/core/tensor_slot.h"
#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/data_parallel/ddp/int8_all_reduce.h"
#include "paratrain/data_parallel/ddp/reducer.h"

namespace paratrain::ddp {

struct Int8CompressionOptions {
  /// Elements per fp32 scale (Note [The int8 gradient wire]).
  int64_t block = kInt8WireBlock;
  /// Keep what quantization dropped and add it to the next step's gradient.
  bool error_feedback = true;
};

class Int8Compression : public std::enable_shared_from_this<Int8Compression> {
 public:
  explicit Int8Compression(Int8CompressionOptions options = {});  ///< make it with std::make_shared

  /// The comm hook for ReducerOptions::comm_hook (all-reduce); it keeps this
  /// object alive.
  BucketCommHook hook();
  /// ZeRO-2's collective for bucket `index`: a reduce-scatter of `buffer`
  /// into `shard` (zero/reduce_scatter_sink.h calls it).
  comm::WorkHandle reduce_scatter(comm::ProcessGroup& group, std::size_t index, at::Tensor& shard,
                                  const at::Tensor& buffer);
  /// Reads the reducer's buckets (which parameters at which offsets). Call
  /// once, after the reducer is built and before the first backward;
  /// `reduce_scatter`: the buckets go through reduce_scatter(), not hook().
  void attach(const Reducer& reducer, bool reduce_scatter = false);

  const Int8CompressionOptions& options() const { return options_; }
  /// Bytes this rank sends per synchronized step over p ranks (both phases
  /// for the all-reduce, one for the reduce-scatter), next to fp32's.
  int64_t bytes_per_step(int p) const;
  int64_t fp32_bytes_per_step(int p) const;  ///< a ring all-reduce / reduce-scatter of the fp32 buckets
  /// Bucket b's residuals (undefined before its first call or without error feedback).
  Int8Residuals residuals(std::size_t bucket) const;

  /// This rank's residuals as checkpoint slots (names "int8_wire/...") over a
  /// snapshot taken now; loading fills them, then call state_loaded().
  /// `rank` and `world` are the group's. Valid after attach().
  std::vector<TensorSlot> state_slots(int rank, int world);
  /// After a load filled the last state_slots(): installs that state; the
  /// slots in `missing` (another world size for "sent") start at zero, and
  /// a log line says so.
  void state_loaded(const std::vector<std::string>& missing);

 private:
  struct Param {
    std::string name;
    int64_t offset = 0, numel = 0;
  };
  struct BucketState {
    std::vector<Param> params;
    int64_t numel = 0;     ///< the buffer's (padded) length
    at::Device device = at::kCPU;
    int world = 0;         ///< the group size the residuals were made for; 0 = none yet
    bool scatter = false;  ///< reduce-scatter (no summed residual)
    Int8Residuals residuals;
    std::shared_ptr<Int8Scratch> scratch = std::make_shared<Int8Scratch>();  ///< the wire's buffers, reused
  };

  comm::WorkHandle start(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer);
  BucketState& bucket(std::size_t index, int64_t numel, const char* who);
  void ensure_residuals(BucketState& b, int world);

  Int8CompressionOptions options_;
  FollowUpGroup second_;
  std::vector<BucketState> buckets_;
  bool attached_ = false;
  std::optional<std::vector<Int8Residuals>> pending_;  ///< the snapshot of state_slots()
  int pending_rank_ = 0;                                ///< the rank it was taken for
  mutable std::mutex mu_;
};

}  // namespace paratrain::ddp

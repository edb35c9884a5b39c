// PowerSGD gradient compression (Vogels et al., NeurIPS 2019, arXiv
// 1905.13727) as a DDP comm hook: each bucket's matrices are sent as two thin
// rank-r factors instead of n x m numbers.
//
// Per step and bucket, for each compressed gradient G (n x m, the local
// gradient plus this rank's error from the last step):
//   P = G Q            all-reduce(sum) P, orthonormalize P's columns
//   Q = G^T P          all-reduce(sum) Q, divide by the world size
//   approx = P Q^T     the bucket receives it; error = G - approx stays local
// Q starts from N(0, 1) drawn from `seed` (the same on every rank, so the sum
// of G_r Q is the sum of the ranks' projections) and, with warm start, is the
// last step's Q afterwards: one power iteration per step refines it.
// Bytes per matrix: r (n + m) instead of n m. 1-D tensors, and matrices whose
// compression rate n m / (r (n + m)) is under `min_compression_rate`, go in
// one plain all-reduce beside the factors.
//
// Error feedback: what compression dropped is added to the next step's
// gradient, so nothing is lost, only delayed: after T compressed steps,
// sum of applied averages + mean over ranks of the errors = sum of the true
// averages (exact up to rounding; tests/ddp/powersgd_test.cpp checks it).
// At r = min(n, m) the approximation is exact (P spans G's column space).
//
// State (Q and the error per matrix) lives in the hook, on the gradients'
// device: one extra gradient-sized buffer for the errors. It travels in
// checkpoints through state_slots() / state_loaded(): see Note [PowerSGD
// state in checkpoints] in powersgd_state.cpp. A resumed run then continues
// exactly as the uninterrupted one (PyTorch's hook needs its state pickled
// by hand for that).
//
// Create it with std::make_shared (hook() shares ownership with the reducer).
//
//   auto powersgd = std::make_shared<ddp::PowerSgd>(ddp::PowerSgdOptions{.rank = 4});
//   ddp::DdpOptions options;
//   options.reducer.comm_hook = powersgd->hook();
//   ddp::DistributedDataParallel ddp(model, group, options);
//   powersgd->attach(ddp.reducer());  // learns the buckets' shapes
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
#include "paratrain/data_parallel/ddp/reducer.h"

namespace paratrain::ddp {

/// PowerSGD's knobs (names as in PyTorch's PowerSGDState where they match).
struct PowerSgdOptions {
  /// r: columns of the factors. Higher = closer to the full gradient and more
  /// bytes. Clipped to min(n, m) per matrix.
  int64_t rank = 1;
  /// Synchronized steps (per bucket) sent uncompressed before PowerSGD starts:
  /// the first steps' gradients change fast and compression error hurts most
  /// there (PyTorch's start_powerSGD_iter; its docs suggest ~10% of training).
  int64_t start_step = 0;
  bool error_feedback = true;  ///< add what compression dropped to the next step's gradient
  /// Reuse the last step's Q (one power iteration per step); off: fresh N(0,1)
  /// every step from the shared stream.
  bool warm_start = true;
  /// Matrices compressed less than this (n m / (r (n + m))) are sent plain:
  /// the factors would cost about as much as the matrix. 0 compresses all.
  double min_compression_rate = 2.0;
  /// Seed of Q's initial values; must be the same on every rank.
  uint64_t seed = 0;
};

/// PowerSGD compression as a DDP comm hook; see this header's opening comment.
class PowerSgd : public std::enable_shared_from_this<PowerSgd> {
 public:
  explicit PowerSgd(PowerSgdOptions options = {});  ///< make it with std::make_shared

  /// The comm hook for ReducerOptions::comm_hook; it keeps this object alive.
  BucketCommHook hook();
  /// Reads the reducer's buckets (which parameters at which offsets, their
  /// shapes). Call once, after DDP is built and before the first backward.
  void attach(const Reducer& reducer);

  const PowerSgdOptions& options() const { return options_; }  ///< as constructed
  /// Floats sent per rank for one step of every bucket: compressed and plain,
  /// next to what an uncompressed all-reduce would send. Valid after attach().
  int64_t floats_sent_per_step() const;
  int64_t floats_uncompressed_per_step() const;  ///< what plain DDP would send
  /// The local error of bucket b (empty before its first compressed step, or
  /// without error feedback), laid out like the bucket buffer.
  at::Tensor error(std::size_t bucket) const;

  /// This rank's state as checkpoint slots (names "powersgd/...", without
  /// the checkpoint's prefix), over a snapshot taken now: saving writes them,
  /// loading fills them in place and then calls state_loaded(). `rank` and
  /// `world` are the hook's group's (each rank's error is its own row).
  /// Valid after attach(). See Note [PowerSGD state in checkpoints].
  std::vector<TensorSlot> state_slots(int rank, int world);
  /// After a load filled the last state_slots(): installs that state.
  /// `missing` names the slots the checkpoint did not have (or had at
  /// another shape: another world size or rank r); those parts start afresh,
  /// and a log line says so.
  void state_loaded(const std::vector<std::string>& missing);

 private:
  struct Matrix {
    std::string name;  ///< the parameter's, for checkpoint slots
    int64_t offset = 0, rows = 0, cols = 0, rank = 0;
  };
  struct Plain {
    int64_t offset = 0, numel = 0;
  };
  struct BucketState {
    std::vector<Matrix> matrices;
    std::vector<Plain> plain;
    int64_t numel = 0;
    int64_t steps = 0;              ///< hook calls so far
    std::vector<at::Tensor> qs;     ///< per matrix, [cols, rank]; empty until first compressed step
    at::Tensor error;               ///< [numel]; zero outside compressed matrices
    at::ScalarType compute = at::kFloat;  ///< dtype of qs and error (fp32, or fp64 buckets)
    at::Device device = at::kCPU;         ///< the bucket's (where qs and error live)
  };
  /// The snapshot state_slots() hands out and state_loaded() installs.
  struct Pending {
    at::Tensor steps;                          ///< int64 {hook calls, compressed calls}
    at::Tensor generator;                      ///< the Q stream's state
    std::vector<std::vector<at::Tensor>> qs;   ///< per bucket, per matrix
    std::vector<at::Tensor> errors;            ///< per bucket (empty without error feedback)
  };
  class StepWork;  ///< one bucket's step: plain + P all-reduce, then Q's

  comm::WorkHandle start(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer);

  PowerSgdOptions options_;
  // Q's all-reduces: Note [Second phases on their own group] (compress_hook.h).
  FollowUpGroup second_;
  std::vector<BucketState> buckets_;
  at::Generator generator_;
  bool attached_ = false;
  std::optional<Pending> pending_;  ///< released by the next step
  mutable std::mutex mu_;
};

}  // namespace paratrain::ddp

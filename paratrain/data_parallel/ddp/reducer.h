// The reducer: bucketing of gradients during backward. Gradients are packed
// into buckets (bucket_plan.h); a hook on each parameter's gradient
// accumulator copies its gradient in, and a bucket's collective starts (via
// the bucket sink, bucket_sink.h) as soon as its last gradient is there,
// overlapping with the rest of backward. When backward ends, autograd runs our
// callback, which waits for every bucket, hands each result to the sink and
// (DDP's default sink) writes the averaged gradients back, so after
// loss.backward() returns the gradients are synchronized (as in PyTorch DDP).
// Not here: what the collective is (the sink), broadcasting parameters,
// buffers, no_sync's guard (ddp.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/bucket.h"
#include "paratrain/data_parallel/ddp/bucket_plan.h"
#include "paratrain/data_parallel/ddp/bucket_sink.h"
#include "paratrain/data_parallel/ddp/step_stats.h"

namespace torch::autograd {
struct Node;
}

namespace paratrain::ddp {

/// A parameter and the name errors call it by.
struct NamedParameter {
  std::string name;  ///< used in error messages ("fc2.weight")
  at::Tensor tensor;  ///< the parameter itself (requires grad)
};

/// Starts the collective of bucket `index` on its flat buffer and returns it in
/// flight. When the returned work completes, `buffer` must hold the reduced
/// (already pre-divided, see Note [Averaging]) gradients. The default is an
/// all-reduce sum; compression hooks plug in here. A hook keeps DDP's
/// write-back; to consume the result yourself (reduce-scatter), use a sink.
using BucketCommHook =
    std::function<comm::WorkHandle(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer)>;

/// How a Reducer buckets, communicates and hands over gradients.
struct ReducerOptions {
  /// How plan_buckets() groups parameters; ignored when `plans` is given.
  BucketPlanOptions buckets;
  /// Explicit buckets instead of plan_buckets(): indices into the reducer's
  /// parameter list, launched in this order (FSDP: one bucket per wrapping
  /// unit). Checked by validate_plans() (bucket_plan.h). Every rank must pass
  /// the same plans. Empty: plan_buckets(params, buckets).
  std::vector<BucketPlan> plans;
  /// Off: a parameter that gets no gradient in a synchronized backward is an
  /// error naming it (all ranks must reduce the same buckets). On: such a
  /// parameter contributes its current .grad (zero if none) and an extra small
  /// all-reduce per step finds parameters no rank used, whose .grad is left
  /// untouched. Costs that collective and the overlap of every bucket holding
  /// an unused parameter (it can only launch when backward ends). See Note
  /// [Unused parameters].
  bool find_unused_parameters = false;
  /// On: each .grad is re-pointed at its slot of the bucket buffer, so
  /// backward accumulates straight into the buffer and the averaged result
  /// needs no copy back: saves one gradient-sized buffer and two copies per
  /// step. Off: gradients are copied into the buffer and back, and .grad
  /// tensors stay the user's own. See Note [Gradients as bucket views].
  bool gradient_as_bucket_view = false;
  /// Persistent CPU bucket buffers come from group.allocate_symmetric() when
  /// the backend has symmetric memory (shm): the all-reduce then reduces the
  /// ranks' buffers where they lie, without copying them through the
  /// backend, and with gradient_as_bucket_view backward writes gradients
  /// straight into shared memory. Off, or a backend without it: ordinary
  /// memory. Transient buffers and device tensors never use it.
  bool symmetric_buffers = true;
  /// The collective per bucket, with DDP's write-back; empty = all_reduce(kSum).
  /// Only with the default sink (setting both is an error).
  BucketCommHook comm_hook;
  /// A sink that does not write back (ZeRO-2, FSDP) gets transient bucket
  /// buffers: allocated at a bucket's first gradient in a step, released once
  /// the sink's reduced() consumed them, so between steps the reducer holds no
  /// gradient memory (buffer_bytes() == 0). On: keep them across steps anyway,
  /// saving an allocation per bucket per step at the cost of a full gradient's
  /// memory. Write-back (DDP's default sink) always keeps them: the average is
  /// read back after the wait, and gradient_as_bucket_view aliases .grad to
  /// them. See Note [Transient bucket buffers].
  bool persistent_buffers = false;
  /// With a sink that does not write back (ZeRO-2, FSDP): each parameter's
  /// .grad is reset to undefined in its hook, right after it was copied into
  /// its bucket slot, so a full-size gradient lives only from AccumulateGrad to
  /// that copy instead of until backward ends (peak gradient memory during
  /// backward: the buckets in flight, not the whole model). The .grad after
  /// backward is the same either way (undefined for every synchronized
  /// parameter); what changes: a backward that fails midway has already
  /// dropped the gradients copied so far. Off: keep .grad until the end of
  /// backward. Ignored for write-back sinks (DDP: .grad receives the
  /// average) and while sync is disabled (no_sync(): .grad must accumulate).
  /// See Note [Releasing gradients early].
  bool release_gradients_early = true;
  /// What happens to a filled bucket (bucket_sink.h). Empty: DDP's default,
  /// all-reduce (or `comm_hook`) and write the average back into .grad. A sink
  /// whose writes_back() is false leaves the .grad of every synchronized
  /// parameter undefined after backward (ZeRO-2, FSDP keep only a shard).
  std::shared_ptr<BucketSink> sink;
  /// On a group of one with the default sink and no comm hook the local
  /// gradient already is the average, so the reducer registers no hooks at
  /// all: backward costs nothing extra, synced_steps() stays 0, last_step()
  /// empty. Off: hooks and buckets run as on more ranks, so synced_steps()
  /// counts every synchronized backward (ZeRO relies on it to tell a fresh
  /// gradient from a stale one) at the cost of a copy of every gradient.
  bool single_rank_passthrough = true;
  /// How long the end of backward waits for one bucket before TimeoutError.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

/// Averages gradients over a group during backward: gradient hooks fill
/// buckets, each full bucket's collective (or comm hook) starts while backward
/// goes on, and the end of backward waits for them and writes the averages back
/// (or hands them to a sink). DDP, ZeRO and FSDP are built on it.
class Reducer {
 public:
  /// `params`: the parameters to synchronize, in registration order, each
  /// requiring grad, dense, and distinct. Every rank of `group` must pass the
  /// same shapes and dtypes in the same order. `group` must outlive the reducer.
  /// On a group of one with neither sink nor comm hook, no hooks are
  /// registered unless ReducerOptions::single_rank_passthrough is off.
  Reducer(std::vector<NamedParameter> params, comm::ProcessGroup& group, ReducerOptions options = {});
  /// Removes the hooks and waits for collectives still in flight.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// While off, hooks only record which parameters were used: gradients
  /// accumulate in .grad locally and the next synchronized backward reduces
  /// the accumulated sum (DistributedDataParallel::no_sync()).
  void set_sync_enabled(bool enabled);
  bool sync_enabled() const;  ///< false under no_sync()

  /// Abandons a step whose backward failed before its end-of-backward callback
  /// ran (e.g. an exception in the loss's backward): waits for launched
  /// collectives, clears the step. A no-op between steps. Called by
  /// prepare_forward().
  void reset_step();

  /// Before each forward: reset_step(), then checks that every parameter is
  /// still the tensor the hooks were registered on (Error naming it when the
  /// model was moved or converted after wrapping: its gradients would silently
  /// stay local), and opens the iteration finish_backward() closes. Local, no
  /// communication. See Note [Re-materialized parameters].
  void prepare_forward();

  /// After each loss.backward(): if no gradient hook opened a synchronized
  /// step on this rank since prepare_forward() (its loss reached no
  /// parameter), joins the peers' collectives with this rank's current .grad
  /// (zero after zero_grad()) for every bucket, so they do not hang, and
  /// leaves the average in .grad like a normal step. Never an error for
  /// missing gradients, even without find_unused_parameters: the whole rank
  /// contributes nothing, which is consistent on all ranks. Throws the
  /// prepare_forward() error if the hooks went stale in between. A no-op after
  /// a synchronized step and under no_sync(). See Note [Joining].
  void finish_backward();

  /// The buckets in launch order (explicit plans or plan_buckets()'s). ZeRO-2
  /// derives its shard layout from them: rank r owns slice r of each bucket's
  /// padded buffer.
  const std::vector<BucketPlan>& plans() const { return plans_; }
  const std::vector<NamedParameter>& params() const { return params_; }  ///< as passed, in order
  /// Timings of the latest synchronized backward.
  StepStats last_step() const;
  /// Synchronized backwards completed so far.
  int64_t synced_steps() const;
  /// Bytes of bucket buffers allocated now: every bucket's between steps with
  /// persistent buffers, 0 between steps with transient ones (see
  /// ReducerOptions::persistent_buffers).
  int64_t buffer_bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Location {
    std::size_t bucket;
    std::size_t slot;
  };

  void on_gradient(std::size_t param);
  void check_parameters_locked() const;
  void begin_step_locked(bool from_hook);
  void mark_ready_locked(std::size_t param, bool repoint, bool release);
  void launch_ready_locked();
  void poll_completions_locked();
  double completed_ms_locked(std::size_t bucket) const;
  void finish_step();
  void finish_step_locked(bool joining);
  void write_back_locked(const at::Tensor& globally_used);
  void drain_locked() noexcept;
  double ms_since_start() const;

  comm::ProcessGroup& group_;
  ReducerOptions options_;
  std::shared_ptr<BucketSink> sink_;  ///< options_.sink or the default
  std::vector<NamedParameter> params_;
  std::vector<BucketPlan> plans_;
  std::vector<Bucket> buckets_;
  std::vector<Location> where_;  ///< per parameter
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;

  /// Autograd may call hooks from its device threads (CUDA); one lock keeps
  /// the step state consistent. Uncontended on CPU, where hooks run on the
  /// thread that called backward.
  mutable std::mutex mu_;
  bool sync_enabled_ = true;
  bool passthrough_ = false;       ///< world size 1, default sink: no hooks at all
  bool release_early_ = false;     ///< options_.release_gradients_early, for a non-write-back sink
  bool in_step_ = false;           ///< first hook seen, end-of-backward callback not yet run
  std::size_t next_launch_ = 0;    ///< buckets [0, next_launch_) are launched
  std::size_t next_complete_ = 0;  ///< buckets [0, next_complete_) were seen complete
  std::vector<bool> ready_;        ///< per parameter, this step
  std::vector<bool> used_since_sync_;  ///< per parameter, across no_sync backwards
  Clock::time_point step_start_;
  StepStats current_;
  StepStats last_;
  int64_t synced_steps_ = 0;
  int64_t steps_at_forward_ = -1;  ///< synced_steps_ at prepare_forward(); -1: none yet
};

}  // namespace paratrain::ddp

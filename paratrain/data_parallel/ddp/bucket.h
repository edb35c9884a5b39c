// One gradient bucket at run time: a flat buffer, a view of it per parameter,
// the collective in flight on it, and the state machine that keeps a step
// honest (a bucket cannot be waited on before it was launched).
// Not here: which parameters go in which bucket (bucket_plan.h) and when a
// bucket is launched (reducer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/bucket_plan.h"

namespace paratrain::ddp {

// kFilling -> kReady -> kLaunched -> kReduced -> kFilling (next step).
// Aborting a step (reset()) is legal from any state but kLaunched: a buffer
// the process group is still writing into must be waited on first.
// A transient bucket (BucketOptions) additionally has no buffer between
// steps: acquire() in kFilling allocates it, release() in kReduced or reset()
// drops it. See Note [Transient bucket buffers].
enum class BucketState {
  kFilling,   // waiting for some of its gradients
  kReady,     // all gradients copied in; waits for earlier buckets to launch
  kLaunched,  // collective in flight; the buffer belongs to the process group
  kReduced,   // collective finished; the buffer holds the reduced gradients
};
std::string_view to_string(BucketState state);

struct BucketOptions {
  // Off (DDP): the buffer is allocated once and kept, so .grad may alias it
  // (gradient_as_bucket_view) and the reduced average is read back after the
  // wait; no allocation per step. On (sinks that keep only a shard: ZeRO-2,
  // FSDP): the buffer exists only from acquire() to release()/reset(), so no
  // full-size gradient memory outlives the step; costs one allocation (and
  // on CPU its page faults) per bucket per step, and slots are only
  // available while it exists. A new transient buffer is not zeroed (only
  // its padding is): the caller writes every slot before launch.
  bool transient_buffer = false;
  // Where a persistent buffer comes from at construction (ReducerOptions::
  // symmetric_buffers: the group's symmetric memory); it returns a zeroed
  // tensor of `numel` elements, or an undefined one to fall back to
  // at::zeros. Empty: at::zeros. Called once, from the constructor (a
  // collective allocation must happen on every rank in the same order);
  // abandon()'s replacement buffer is ordinary memory.
  std::function<at::Tensor(int64_t numel, at::ScalarType dtype)> allocate = {};
};

class Bucket {
 public:
  // `params` is the full parameter list the plan indexes into (for shapes).
  Bucket(std::size_t index, BucketPlan plan, const std::vector<at::Tensor>& params, BucketOptions options = {});

  std::size_t index() const { return index_; }
  const BucketPlan& plan() const { return plan_; }
  BucketState state() const { return state_; }
  std::size_t size() const { return slots_.size(); }  // parameters in the bucket
  // Bytes the buffer has when it exists (what the collective moves).
  int64_t bytes() const;
  bool transient() const { return options_.transient_buffer; }
  // Whether the buffer exists now: always for a persistent bucket; for a
  // transient one from acquire() to release()/reset().
  bool has_buffer() const { return buffer_.defined(); }
  // Bytes of bucket buffer this bucket holds now (bytes() or 0).
  int64_t held_bytes() const { return has_buffer() ? bytes() : 0; }

  // Transient: allocates the buffer if it does not exist (kFilling only: the
  // first gradient of a step). A no-op for a persistent bucket or when it
  // already exists.
  void acquire();
  // Transient: drops the buffer once the sink consumed the result (kReduced
  // only; the state stays kReduced until reset()). A no-op for a persistent
  // bucket.
  void release();

  // The flat buffer (plan().padded_numel elements; padding stays zero).
  // Error when it does not exist (transient, not acquired).
  at::Tensor& buffer();
  // Slot i (the i-th parameter of plan().params), shaped like the parameter.
  // It aliases the buffer's storage without being an autograd view, so it can
  // serve as a parameter's .grad: see Note [Gradients as bucket views].
  // Error when the buffer does not exist.
  const at::Tensor& slot(std::size_t i) const;
  int64_t slot_numel(std::size_t i) const { return numels_.at(i); }

  // Records that slot i holds its gradient. Returns true when that was the
  // last one, after which the caller calls mark_ready(). kFilling only; a
  // slot filled twice in one step is an error.
  bool fill(std::size_t i);
  bool filled(std::size_t i) const { return filled_.at(i); }
  // kFilling -> kReady; every slot must be filled.
  void mark_ready();
  // kReady -> kLaunched; `work` is the collective now writing the buffer.
  void launch(comm::WorkHandle work);
  bool work_completed() const;  // kLaunched: has the collective finished?
  // When the backend finished the collective (Work::completed_at()): while
  // launched and after wait() until reset(). nullopt while in flight, or when
  // the backend cannot tell (then the reducer polls, Note [Overlap stats]).
  std::optional<comm::Work::Clock::time_point> completed_at() const;
  // kLaunched -> kReduced; blocks. Rethrows the collective's failure.
  void wait(std::chrono::milliseconds timeout);
  // Back to kFilling for the next step; slots become unfilled; a transient
  // bucket drops its buffer. Not from kLaunched (wait or abandon first).
  void reset();
  // For a failed step: forgets the collective in flight without waiting,
  // keeping its old buffer alive (the backend may still write it), and gives
  // the bucket a fresh zeroed buffer (a transient one: none until the next
  // acquire()). Parameters whose .grad aliased the old buffer keep it; the
  // reducer re-points them on their next gradient.
  void abandon();

 private:
  void expect(BucketState expected, std::string_view action) const;
  void make_buffer(bool first = false);
  void drop_buffer();
  void missing_buffer(std::string_view action) const;

  std::size_t index_;
  BucketPlan plan_;
  BucketOptions options_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> numels_;
  at::Tensor buffer_;
  std::vector<at::Tensor> slots_;
  std::vector<bool> filled_;
  std::size_t pending_ = 0;
  BucketState state_ = BucketState::kFilling;
  comm::WorkHandle work_;
  std::optional<comm::Work::Clock::time_point> completed_at_;  // kept from work_ by wait()
  // Buffers of abandoned collectives: never freed while a backend may use them.
  std::vector<std::pair<at::Tensor, comm::WorkHandle>> abandoned_;
};

}  // namespace paratrain::ddp

// Our process-group interface: the collectives every strategy is built from.
// Backends (comm/gloo today; MPI, NCCL later) implement it; strategies receive
// a group explicitly (there is no global "current group").
// Not here: rendezvous (comm/rendezvous.h) and rank arithmetic (topology/).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace paratrain::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
std::string_view to_string(ReduceOp op);

inline constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

/// An operation in flight. Tensors passed to the operation must stay alive and
/// untouched until wait() returns.
class Work {
 public:
  using Clock = std::chrono::steady_clock;  ///< the clock of completed_at()
  virtual ~Work() = default;
  /// Blocks until done and applies any finishing step (AVG's division).
  /// Throws TimeoutError after `timeout`, CommError if the operation failed or
  /// the group was aborted. Calling wait() again after it returned is allowed
  /// and returns at once (or rethrows the same error). Two threads may wait on
  /// the same Work: the finishing step runs once and both return after it.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  /// Same, with the deadline the group was configured with.
  void wait() { wait(default_timeout()); }
  /// True once wait() would not block on the backend.
  virtual bool is_completed() = 0;
  /// When the backend finished the operation (the data arrived), stamped by the
  /// backend itself, not by whoever polled. nullopt while in flight, after a
  /// failure, or when the backend cannot tell (see its header).
  virtual std::optional<Clock::time_point> completed_at() { return std::nullopt; }

 protected:
  /// What wait() without an argument waits for; backends return their group's.
  virtual std::chrono::milliseconds default_timeout() const { return kDefaultTimeout; }
};
using WorkHandle = std::shared_ptr<Work>;

/// All tensors must be contiguous and on the group's device. Every member must
/// call a collective in the same order with tensors of the same size.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;             ///< this member's rank in the group, 0 .. size() - 1
  virtual int size() const = 0;             ///< members of the group
  virtual std::string backend() const = 0;  ///< "gloo", "mpi", ... (for logs and errors)
  /// Global (world) rank of each member, indexed by rank in this group.
  virtual const std::vector<int>& global_ranks() const = 0;

  /// Every rank's `tensor` becomes the reduction of all of them, in place.
  virtual WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  /// output.numel() == size() * input.numel(); rank r's input lands in slice r
  /// of the flattened output.
  virtual WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  /// input.numel() == size() * output.numel(); rank r receives the reduction
  /// over ranks of slice r of the flattened input.
  virtual WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op = ReduceOp::kSum) = 0;
  /// Every rank's `tensor` becomes root's.
  virtual WorkHandle broadcast(at::Tensor& tensor, int root) = 0;
  /// Point to point: matched by the recv of rank `dst` with the same tag.
  virtual WorkHandle send(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  /// Fills `tensor` (sized by the caller) with what rank `src` sent with `tag`.
  virtual WorkHandle recv(at::Tensor& tensor, int src, int tag = 0) = 0;
  /// Completes once every member has entered it.
  virtual WorkHandle barrier() = 0;

  /// `input` is cut along dim 0 into consecutive blocks of input_split_sizes[j]
  /// rows; block j goes to rank j. `output` receives output_split_sizes[s] rows
  /// from each rank s, stacked in rank order. Empty split lists mean equal splits
  /// (dim 0 divisible by size()). Other dims of input and output must match.
  /// Split sizes must agree across ranks: what r sends to j is what j expects
  /// from r.
  virtual WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input,
                                std::vector<int64_t> output_split_sizes = {},
                                std::vector<int64_t> input_split_sizes = {}) = 0;
  /// The reduction over ranks lands in `tensor` on `root`; on other ranks
  /// `tensor` is used as scratch and its contents afterwards are unspecified.
  virtual WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum) = 0;
  /// On root, output.numel() == size() * input.numel() and rank r's input lands
  /// in slice r of the flattened output. Elsewhere `output` is ignored (may be
  /// undefined).
  virtual WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) = 0;
  /// The mirror of gather: on root, input.numel() == size() * output.numel()
  /// and slice r of the flattened input lands in rank r's output. Elsewhere
  /// `input` is ignored (may be undefined).
  virtual WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) = 0;
  /// all_gather with per-rank sizes: rank r contributes counts[r] elements
  /// (input.numel() == counts[rank()]), output is their concatenation in rank
  /// order (output.numel() == sum(counts)). All ranks pass the same counts.
  /// For shards of a tensor whose numel is not divisible by size().
  virtual WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                                       const std::vector<int64_t>& counts) = 0;

  /// Aborts the group on this rank; safe from any thread, idempotent. After it:
  /// waiters blocked in Work::wait on this group's operations return at once
  /// with CommError ("... group aborted ..."), as does every later wait() of an
  /// unfinished operation, and every new operation throws CommError when
  /// issued. Tensors of aborted operations hold unspecified contents, and the
  /// backend may still touch them until its threads see the closed connections
  /// (promptly for Gloo; at worst the group timeout). Peers are
  /// not told explicitly: the backend closes its connections, so their pending
  /// and later operations with this rank fail with CommError (or at worst time
  /// out). Sub-groups created from this group are aborted too; a
  /// new_subgroup() that is still connecting is not interrupted. A group cannot
  /// be revived; build a new one.
  virtual void abort() = 0;

  /// Collective over this group: every member calls it with the same list of
  /// ranks (ranks of this group, strictly increasing). Members get the new
  /// group, non-members nullptr. Later strategies build dp/tp/pp groups this way.
  virtual std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) = 0;

  /// Symmetric memory: a zeroed CPU tensor of `numel` elements that every
  /// member's collectives can read directly (the shm backend maps every
  /// member's copy into every member's process). An all_reduce of exactly
  /// such a tensor (or of one contiguous piece of it, the same piece on every
  /// member) then reduces in place from the peers' copies instead of copying
  /// through the transport. Collective: every member calls it with the same
  /// sizes in the same order. Undefined tensor when the backend has no such
  /// memory (the default): allocate normally then. DDP's bucket buffers come
  /// from here, so backward writes gradients straight into shared memory.
  virtual at::Tensor allocate_symmetric(int64_t numel, at::ScalarType dtype) { return {}; }
};

}  // namespace paratrain::comm

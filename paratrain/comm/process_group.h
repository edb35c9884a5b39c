// Our process-group interface: the collectives every strategy is built from.
// Backends (comm/gloo today; MPI, NCCL later) implement it; strategies receive
// a group explicitly (there is no global "current group").
// Not here: rendezvous (comm/rendezvous.h) and rank arithmetic (topology/).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace paratrain::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
std::string_view to_string(ReduceOp op);

inline constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};

// An operation in flight. Tensors passed to the operation must stay alive and
// untouched until wait() returns.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done and applies any finishing step (AVG's division).
  // Throws TimeoutError after `timeout`, CommError if the operation failed.
  // Calling wait() twice is allowed; the second call returns at once.
  virtual void wait(std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  virtual bool is_completed() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

// All tensors must be contiguous and on the group's device. Every member must
// call a collective in the same order with tensors of the same size.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  // Global (world) rank of each member, indexed by rank in this group.
  virtual const std::vector<int>& global_ranks() const = 0;

  virtual WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // output.numel() == size() * input.numel(); rank r's input lands in slice r
  // of the flattened output.
  virtual WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  // input.numel() == size() * output.numel(); rank r receives the reduction
  // over ranks of slice r of the flattened input.
  virtual WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op = ReduceOp::kSum) = 0;
  virtual WorkHandle broadcast(at::Tensor& tensor, int root) = 0;
  virtual WorkHandle send(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkHandle recv(at::Tensor& tensor, int src, int tag = 0) = 0;
  virtual WorkHandle barrier() = 0;

  // Collective over this group: every member calls it with the same list of
  // ranks (ranks of this group, strictly increasing). Members get the new
  // group, non-members nullptr. Later strategies build dp/tp/pp groups this way.
  virtual std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) = 0;
};

}  // namespace paratrain::comm

// FSDP's internal engine (FullyShardedDataParallel::Impl): the per-step
// state machine that gathers units when operations touch them and frees
// them; gradients go through the DDP reducer (one bucket per unit). Internal to
// fsdp/: the public surface is fsdp.h. Not here: construction-time
// collectives, accounting and clipping (fsdp.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "paratrain/data_parallel/ddp/reducer.h"
#include "paratrain/data_parallel/fsdp/flat_unit.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/data_parallel/fsdp/grad_sink.h"
#include "paratrain/data_parallel/fsdp/touch_observer.h"

namespace torch::autograd {
struct Node;
}

namespace paratrain::fsdp {

class FullyShardedDataParallel::Impl final : public TouchListener,
                                             public std::enable_shared_from_this<FullyShardedDataParallel::Impl> {
 public:
  Impl(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& group, FsdpOptions options,
       std::vector<FlatUnit> units);
  ~Impl() override;

  // Observes operations on the calling thread (shared_from_this needs the
  // Impl owned by a shared_ptr already, hence not in the constructor).
  void observe_this_thread();

  void on_operation(const at::RecordFunction& fn) noexcept override;

  void prepare_forward();
  void rethrow_kept_error();
  void reshard_all();

  std::shared_ptr<torch::nn::Module> model;
  comm::ProcessGroup& group;
  FsdpOptions options;
  std::vector<FlatUnit> units;
  std::vector<std::vector<at::Tensor>> pieces;  // pieces[u][k]: optimizer leaf for units[u].pieces()[k]
  FsdpStats stats;

  bool sync_enabled() const;
  void set_sync_enabled(bool enabled);
  int64_t reduce_scatters() const { return sink_->launches(); }

 private:
  enum class Phase { kIdle, kForward, kBackward };

  void make_reducer();
  void keep_error(const at::RecordFunction& fn) noexcept;
  void touch(std::size_t u);
  void gather_now(std::size_t u);
  void prefetch(std::size_t u);
  void free_unit(std::size_t u);
  int unit_of(const at::Tensor& t) const;
  void begin_backward();
  void on_gradient(std::size_t u);
  void end_of_backward();
  void abandon_step() noexcept;
  // The unit expected after `u` in forward order (+1) or before it (-1), or -1.
  int neighbour(std::size_t u, int direction) const;

  Phase phase_ = Phase::kIdle;
  int current_ = -1;  // the unit forward is in (reshard_after_forward frees it when the next starts)
  // Forward order of units, recorded while the first step runs forward;
  // prefetching uses it once final. See Note [Prefetch order].
  std::vector<std::size_t> order_;
  std::vector<int> position_;  // unit -> index in order_, -1 if not (yet) in it
  bool order_final_ = false;
  // Backward bookkeeping, per unit.
  std::vector<int> trainable_;  // parameters per unit
  std::vector<int> ready_;      // gradients seen this backward
  std::shared_ptr<UnitGradSink> sink_;
  std::unique_ptr<ddp::Reducer> reducer_;  // reduces gradients: one bucket per unit, sink_ as its sink
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::exception_ptr kept_error_;
};

}  // namespace paratrain::fsdp

// FSDP's per-step engine: gather on touch, free, and gradients reduced by the
// DDP reducer, one bucket per unit. See engine.h; the public API is fsdp.h.
#include "paratrain/data_parallel/fsdp/engine.h"

#include <ATen/record_function.h>
#include <torch/torch.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"

namespace paratrain::fsdp {

// Note [Gather on touch]
// LibTorch's C++ modules have no forward pre-hooks, and our models call their
// layers directly (Mlp holds its Linear layers in a vector), so wrapping a
// child module in a gathering module would never be called. Instead the
// engine watches operations: RecordFunction reports every dispatcher
// operation with its inputs just before it runs (touch_observer.h). When an
// input shares the StorageImpl of a unit's full buffer (a parameter, or a
// view of one saved for backward), the unit is gathered before the operation
// reads it. This is exact at operation granularity in forward and backward,
// needs no change to the model, and sees saved tensors too. Costs: every
// operation on the driving thread boxes its inputs for the callback (a few
// hundred ns each), and gathers happen on the thread that runs the model.
// Operations that read memory without going through the dispatcher (none in
// LibTorch's layers) would not be seen.
//
// Autograd nodes are reported too (scope BACKWARD_FUNCTION): the first one
// marks the start of backward, where the engine queues its end-of-backward
// callback. In forward, reshard_after_forward frees the previous unit when an
// operation touches the next; the last unit stays gathered because backward
// starts with it. In backward a unit is freed once all its parameters have
// their gradient (AccumulateGrad runs after every use of the parameter), and
// anything still gathered is freed at the end of backward.
//
// Note [Prefetch order]
// Registration order is not execution order (the root unit comes first but
// may run last), so the first step records the order in which forward
// touches units and prefetches nothing; later steps prefetch the next unit of
// that order in forward and the previous one in backward. A wrong guess only
// costs an early gather: correctness comes from gathering on touch.

// Note [Gradients through the reducer]
// FSDP reduces gradients with the same code as DDP and ZeRO-2: a ddp::Reducer
// with one explicit bucket per unit (last unit first, the order backward
// produces them) and UnitGradSink as its sink, which reduce-scatters the
// bucket and adds this rank's slice into the shard pieces' .grad. The
// reducer brings index-ordered launch (all ranks issue the same
// reduce-scatters in the same order), overlap with the rest of backward,
// no_sync(), find_unused_parameters, timeouts and step stats. Two of its
// defaults for a sink that does not write back keep stage 3's memory: bucket
// buffers are transient (a unit's flat gradient exists from its first
// gradient until the sink consumed the reduce-scatter), and each full .grad
// is reset as soon as it is copied into the bucket (Note [Releasing
// gradients early] in ddp.md). Between steps no full-size gradient and no
// bucket remains. Our own hooks only count gradients per unit, to free a
// unit as soon as its backward is over.

FullyShardedDataParallel::Impl::Impl(std::shared_ptr<torch::nn::Module> model_in, comm::ProcessGroup& group_in,
                                     FsdpOptions options_in, std::vector<FlatUnit> units_in)
    : model(std::move(model_in)), group(group_in), options(std::move(options_in)), units(std::move(units_in)) {
  const std::size_t n = units.size();
  position_.assign(n, -1);
  trainable_.assign(n, 0);
  ready_.assign(n, 0);
  pieces.resize(n);
  for (std::size_t u = 0; u < n; ++u) {
    for (const ShardPiece& piece : units[u].pieces()) {
      pieces[u].push_back(units[u].shard().narrow(0, piece.shard_begin, piece.numel).detach().requires_grad_(true));
    }
  }
  // Before our hooks: post-hooks run in registration order, so the reducer
  // has copied (and released) a gradient before on_gradient() sees it.
  make_reducer();
  // A post-hook on each parameter's gradient accumulator runs after
  // AccumulateGrad wrote .grad: the last one of a unit ends that unit's
  // backward, and the unit is freed. We hold the accumulators so the hooks
  // survive between graphs.
  for (std::size_t u = 0; u < n; ++u) {
    for (const UnitParam& p : units[u].params()) {
      auto acc = torch::autograd::impl::grad_accumulator(p.tensor);
      if (!acc) {
        throw Error(fmt::format("rank {}: FSDP: parameter '{}' has no gradient accumulator", group.rank(), p.name));
      }
      hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, u](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            on_gradient(u);
            return outputs;
          })));
      accumulators_.push_back(std::move(acc));
      ++trainable_[u];
    }
  }
}

// One bucket per unit, the last unit's first: backward produces gradients
// from the last unit to the first, and the reducer launches buckets in index
// order, so this order lets each unit's reduce-scatter start as its backward
// ends. See Note [Gradients through the reducer].
void FullyShardedDataParallel::Impl::make_reducer() {
  std::vector<ddp::NamedParameter> params;
  std::vector<ddp::BucketPlan> plans;
  std::vector<std::size_t> bucket_to_unit;
  for (std::size_t u = units.size(); u-- > 0;) {
    const FlatUnit& unit = units[u];
    ddp::BucketPlan plan;
    plan.dtype = unit.shard().scalar_type();
    plan.device = unit.shard().device();
    for (const UnitParam& p : unit.params()) {
      plan.params.push_back(params.size());
      plan.offsets.push_back(p.offset);
      params.push_back({p.name, p.tensor});
    }
    plan.numel = unit.numel();
    plan.padded_numel = unit.padded_numel();
    plans.push_back(std::move(plan));
    bucket_to_unit.push_back(u);
  }
  sink_ = std::make_shared<UnitGradSink>(units, pieces, std::move(bucket_to_unit));
  ddp::ReducerOptions reducer_options;
  reducer_options.plans = std::move(plans);
  reducer_options.sink = sink_;
  reducer_options.find_unused_parameters = options.find_unused_parameters;
  reducer_options.timeout = options.timeout;
  // Explicit, though both are the defaults for a sink that does not write
  // back: a bucket buffer exists only while its unit's gradient is in flight,
  // and each full .grad is freed as soon as it is in its bucket.
  reducer_options.persistent_buffers = false;
  reducer_options.release_gradients_early = true;
  reducer_ = std::make_unique<ddp::Reducer>(std::move(params), group, std::move(reducer_options));
}

void FullyShardedDataParallel::Impl::set_sync_enabled(bool enabled) { reducer_->set_sync_enabled(enabled); }

bool FullyShardedDataParallel::Impl::sync_enabled() const { return reducer_->sync_enabled(); }

FullyShardedDataParallel::Impl::~Impl() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  abandon_step();
}

void FullyShardedDataParallel::Impl::observe_this_thread() {
  fsdp::observe_this_thread(shared_from_this());
  // A GPU backward runs on the engine's thread for that GPU.
  if (!units.empty() && !units.front().full().is_cpu()) fsdp::observe_engine_threads(shared_from_this());
}

void FullyShardedDataParallel::Impl::prepare_forward() {
  observe_this_thread();
  if (phase_ == Phase::kBackward) abandon_step();  // a backward threw before its end
  rethrow_kept_error();
  if (!order_.empty()) order_final_ = true;
  phase_ = Phase::kForward;
  current_ = -1;
}

void FullyShardedDataParallel::Impl::rethrow_kept_error() {
  if (kept_error_) std::rethrow_exception(std::exchange(kept_error_, nullptr));
}

void FullyShardedDataParallel::Impl::reshard_all() {
  for (std::size_t u = 0; u < units.size(); ++u) free_unit(u);
  current_ = -1;
}

// ---- seeing operations ------------------------------------------------------

void FullyShardedDataParallel::Impl::on_operation(const at::RecordFunction& fn) noexcept {
  try {
    if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
      if (phase_ != Phase::kBackward) begin_backward();
      return;
    }
    auto visit = [&](const at::Tensor& t) {
      const int u = unit_of(t);
      if (u < 0) return;
      try {
        touch(static_cast<std::size_t>(u));
      } catch (...) {
        // The operation runs anyway (RecordFunction swallows exceptions):
        // give it zeros rather than freed memory, keep the error for the
        // next engine call (end of backward, prepare_forward, step), and go
        // on with the operation's other inputs.
        keep_error(fn);
        units[u].fill_zeros_if_freed();
      }
    };
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isTensor()) {
        visit(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) visit(t);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isTensor()) visit(e.toTensor());
        }
      }
    }
  } catch (...) {
    keep_error(fn);
  }
}

// Inside a catch block: logs the error now (the operation that hit it goes
// on) and keeps the first one of the step for rethrow_kept_error().
void FullyShardedDataParallel::Impl::keep_error(const at::RecordFunction& fn) noexcept {
  try {
    throw;
  } catch (const std::exception& e) {
    spdlog::error("rank {}: FSDP: before '{}': {}", group.rank(), fn.name(), e.what());
  } catch (...) {
  }
  if (!kept_error_) kept_error_ = std::current_exception();
}

int FullyShardedDataParallel::Impl::unit_of(const at::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) return -1;
  const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (units[u].storage() == s) return static_cast<int>(u);
  }
  return -1;
}

void FullyShardedDataParallel::Impl::touch(std::size_t u) {
  if (phase_ == Phase::kIdle) phase_ = Phase::kForward;  // forward without prepare_forward()
  if (phase_ == Phase::kForward) {
    if (current_ != static_cast<int>(u)) {
      if (!order_final_ && position_[u] < 0) {
        position_[u] = static_cast<int>(order_.size());
        order_.push_back(u);
      }
      if (options.reshard_after_forward && current_ >= 0) free_unit(static_cast<std::size_t>(current_));
      current_ = static_cast<int>(u);
    }
    gather_now(u);
    if (options.prefetch) {
      const int next = neighbour(u, +1);
      if (next >= 0) prefetch(static_cast<std::size_t>(next));
    }
    return;
  }
  gather_now(u);
  if (options.prefetch) {
    const int prev = neighbour(u, -1);
    if (prev >= 0 && ready_[prev] < trainable_[prev]) prefetch(static_cast<std::size_t>(prev));
  }
}

int FullyShardedDataParallel::Impl::neighbour(std::size_t u, int direction) const {
  if (!order_final_ || position_[u] < 0) return -1;
  const int p = position_[u] + direction;
  return p >= 0 && p < static_cast<int>(order_.size()) ? static_cast<int>(order_[p]) : -1;
}

void FullyShardedDataParallel::Impl::gather_now(std::size_t u) {
  if (units[u].state() == UnitState::kFreed) ++stats.all_gathers;
  units[u].wait_gathered(group, options.timeout);
}

void FullyShardedDataParallel::Impl::prefetch(std::size_t u) {
  if (units[u].state() != UnitState::kFreed) return;
  units[u].start_gather(group);
  ++stats.all_gathers;
  ++stats.prefetches;
}

void FullyShardedDataParallel::Impl::free_unit(std::size_t u) {
  if (units[u].state() == UnitState::kFreed) return;
  units[u].free(options.timeout);
  ++stats.frees;
}

// ---- backward ---------------------------------------------------------------

// Called from the first autograd node of a backward: asks autograd to call
// end_of_backward() once the whole graph ran (as the DDP reducer does).
void FullyShardedDataParallel::Impl::begin_backward() {
  phase_ = Phase::kBackward;
  if (!order_.empty()) order_final_ = true;
  std::fill(ready_.begin(), ready_.end(), 0);
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_of_backward(); });
}

void FullyShardedDataParallel::Impl::on_gradient(std::size_t u) {
  try {
    if (phase_ != Phase::kBackward) begin_backward();
    if (++ready_[u] < trainable_[u]) return;
    // Every parameter of the unit has its gradient (and the reducer's hook,
    // which ran first, has put it in the unit's bucket): its backward is over.
    free_unit(u);
  } catch (...) {
    abandon_step();
    throw;
  }
}

// Runs before the reducer's own end-of-backward callback (ours was queued
// by the first autograd node, the reducer's by the first gradient hook), so
// the units are freed before the reducer waits for the reduce-scatters.
void FullyShardedDataParallel::Impl::end_of_backward() {
  try {
    rethrow_kept_error();
    reshard_all();
    phase_ = Phase::kIdle;
  } catch (...) {
    abandon_step();
    throw;
  }
}

// Lets the reducer wait for reduce-scatters still writing into its buckets,
// then forgets the step.
void FullyShardedDataParallel::Impl::abandon_step() noexcept {
  try {
    reducer_->reset_step();
  } catch (...) {
  }
  for (std::size_t u = 0; u < units.size(); ++u) {
    try {
      free_unit(u);
    } catch (...) {
    }
  }
  phase_ = Phase::kIdle;
  current_ = -1;
}

}  // namespace paratrain::fsdp

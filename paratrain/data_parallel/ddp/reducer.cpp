// Reducer: see reducer.h, and docs/notes/ddp.md for the notes referenced here.
#include "paratrain/data_parallel/ddp/reducer.h"

#include <torch/torch.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

#include <fmt/format.h>

#include "paratrain/comm/low_precision_all_reduce.h"
#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

std::vector<at::Tensor> tensors_of(const std::vector<NamedParameter>& params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.tensor);
  return out;
}

void validate(const std::vector<NamedParameter>& params, int rank) {
  std::unordered_set<const void*> seen;
  for (const auto& p : params) {
    if (!p.tensor.defined()) {
      throw Error(fmt::format("rank {}: reducer: parameter '{}' is an undefined tensor", rank, p.name));
    }
    if (!p.tensor.requires_grad() || !p.tensor.is_leaf()) {
      throw Error(fmt::format("rank {}: reducer: parameter '{}' is not a leaf tensor that requires "
                              "grad; pass only trainable parameters",
                              rank, p.name));
    }
    if (p.tensor.layout() != at::kStrided) {
      throw Error(fmt::format("rank {}: reducer: parameter '{}' is not dense; sparse parameters "
                              "are not supported",
                              rank, p.name));
    }
    if (!seen.insert(p.tensor.unsafeGetTensorImpl()).second) {
      throw Error(fmt::format("rank {}: reducer: parameter '{}' is listed twice (a shared "
                              "parameter); pass each tensor once",
                              rank, p.name));
    }
  }
}

std::string list_names(const std::vector<NamedParameter>& params, const std::vector<std::size_t>& which) {
  constexpr std::size_t kShown = 8;
  std::string out;
  for (std::size_t k = 0; k < which.size() && k < kShown; ++k) {
    out += fmt::format("{}'{}'", k ? ", " : "", params[which[k]].name);
  }
  if (which.size() > kShown) out += fmt::format(" and {} more", which.size() - kShown);
  return out;
}

// DDP's sink: all-reduce sum of the pre-divided buffer (or the user's comm
// hook); the buffer then holds the average and the reducer writes it back.
// Gloo has no bf16 all-reduce, so bf16 buckets (a model converted to bf16)
// go as bytes and are added in fp32 (comm/low_precision_all_reduce.h).
class AllReduceSink final : public BucketSink {
 public:
  explicit AllReduceSink(BucketCommHook hook) : hook_(std::move(hook)) {}
  comm::WorkHandle launch(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) override {
    if (hook_) return hook_(group, index, buffer);
    if (buffer.scalar_type() == at::kBFloat16 && group.backend() == "gloo") {
      return comm::all_reduce_low_precision(group, buffer, at::kBFloat16, &second_.of(group));
    }
    return group.all_reduce(buffer, comm::ReduceOp::kSum);
  }

 private:
  BucketCommHook hook_;
  FollowUpGroup second_;  // Note [Second phases on their own group] (compress_hook.h)
};

}  // namespace

Reducer::Reducer(std::vector<NamedParameter> params, comm::ProcessGroup& group, ReducerOptions options)
    : group_(group), options_(std::move(options)), params_(std::move(params)) {
  validate(params_, group_.rank());
  TORCH_CHECK(!(options_.sink && options_.comm_hook),
              "ReducerOptions: set either `sink` or `comm_hook`, not both (a comm hook only replaces the "
              "default sink's all-reduce; put the collective in your sink instead)");
  sink_ = options_.sink ? options_.sink : std::make_shared<AllReduceSink>(options_.comm_hook);
  release_early_ = options_.release_gradients_early && !sink_->writes_back();
  passthrough_ =
      options_.single_rank_passthrough && group_.size() == 1 && !options_.sink && !options_.comm_hook;
  std::vector<ParamSpec> specs;
  for (const auto& p : params_) {
    specs.push_back({p.tensor.numel(), p.tensor.scalar_type(), p.tensor.device()});
  }
  if (options_.plans.empty()) {
    plans_ = plan_buckets(specs, options_.buckets);
  } else {
    validate_plans(options_.plans, specs);
    plans_ = options_.plans;
  }
  // See Note [Transient bucket buffers].
  BucketOptions bucket_options;
  bucket_options.transient_buffer = !sink_->writes_back() && !options_.persistent_buffers;
  TORCH_CHECK(!(bucket_options.transient_buffer && options_.gradient_as_bucket_view),
              "ReducerOptions: gradient_as_bucket_view with a sink that does not write back: .grad would "
              "alias a bucket buffer that is released after every step. Unset gradient_as_bucket_view (the "
              "sink keeps only a shard, so there is no full gradient to view) or set persistent_buffers");
  if (!bucket_options.transient_buffer && options_.symmetric_buffers) {
    bucket_options.allocate = [this](int64_t numel, at::ScalarType dtype) {
      return group_.allocate_symmetric(numel, dtype);
    };
  }
  const std::vector<at::Tensor> tensors = tensors_of(params_);
  where_.resize(params_.size());
  buckets_.reserve(plans_.size());
  for (std::size_t b = 0; b < plans_.size(); ++b) {
    buckets_.emplace_back(b, plans_[b], tensors, bucket_options);
    for (std::size_t s = 0; s < plans_[b].params.size(); ++s) where_[plans_[b].params[s]] = {b, s};
  }
  ready_.assign(params_.size(), false);
  used_since_sync_.assign(params_.size(), false);

  // A post-hook on the gradient accumulator runs after AccumulateGrad has
  // added this backward's gradient into .grad, so the hook sees the
  // accumulated value (what no_sync() relies on). The variable holds its
  // accumulator weakly; we hold it so our hook survives between graphs.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    if (!acc) {
      throw Error(fmt::format("rank {}: reducer: parameter '{}' has no gradient accumulator",
                              group_.rank(), params_[i].name));
    }
    accumulators_.push_back(acc);
    if (passthrough_) continue;  // see reducer.h: nothing to synchronize
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list& inputs) {
          // No gradient reached it in this backward (a node that returns
          // none for it, as a recomputed segment does for a parameter its
          // layers did not use): as unused, not as a zero.
          if (!inputs.empty() && !inputs[0].defined()) return outputs;
          on_gradient(i);
          return outputs;
        })));
  }
}

Reducer::~Reducer() {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < hook_keys_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  if (in_step_) drain_locked();
}

void Reducer::set_sync_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_enabled_ = enabled;
}

bool Reducer::sync_enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sync_enabled_;
}

void Reducer::reset_step() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_step_) drain_locked();
}

void Reducer::prepare_forward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_step_) drain_locked();
  check_parameters_locked();
  steps_at_forward_ = synced_steps_;
}

void Reducer::finish_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(steps_at_forward_ >= 0,
              "Reducer::finish_backward() without prepare_forward(): call prepare_forward() before each "
              "forward (DistributedDataParallel::prepare_forward()) and finish_backward() after each backward");
  if (passthrough_ || !sync_enabled_ || synced_steps_ > steps_at_forward_) return;
  // No hook fired. Either this rank's loss reached no parameter (join the
  // peers), or the hooks are on tensors the model no longer uses (fail).
  check_parameters_locked();
  try {
    begin_step_locked(/*from_hook=*/false);
    finish_step_locked(/*joining=*/true);
  } catch (...) {
    drain_locked();
    throw;
  }
}

// See Note [Re-materialized parameters]. set_data() with another dtype or
// device (what Module::to() does) drops the parameter's AccumulateGrad node;
// the next backward makes a new one, without our hook.
void Reducer::check_parameters_locked() const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& t = params_[i].tensor;
    const BucketPlan& plan = plans_[where_[i].bucket];
    std::string what;
    if (t.scalar_type() != plan.dtype) {
      what = fmt::format("its dtype changed from {} to {}", c10::toString(plan.dtype), c10::toString(t.scalar_type()));
    } else if (t.device() != plan.device) {
      what = fmt::format("its device changed from {} to {}", plan.device.str(), t.device().str());
    } else if (t.numel() != buckets_[where_[i].bucket].slot_numel(where_[i].slot)) {
      what = "its size changed";
    } else if (torch::autograd::impl::grad_accumulator(t) != accumulators_[i]) {
      what = "its gradient accumulator changed";
    } else {
      continue;
    }
    throw Error(fmt::format(
        "rank {}: DDP: parameter '{}' was re-materialized after DistributedDataParallel was constructed "
        "({}; e.g. model->to(dtype or device) or set_data() after wrapping). The gradient hooks stay on "
        "the old tensor, so its gradients would silently remain local to each rank. Move or convert the "
        "model first, then construct DistributedDataParallel (or construct a new one after the move)",
        group_.rank(), params_[i].name, what));
  }
}

StepStats Reducer::last_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

int64_t Reducer::synced_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_steps_;
}

int64_t Reducer::buffer_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const Bucket& bucket : buckets_) bytes += bucket.held_bytes();
  return bytes;
}

// ---- during backward -------------------------------------------------------

void Reducer::on_gradient(std::size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_enabled_) {
    used_since_sync_[param] = true;  // no_sync(): .grad accumulates locally
    return;
  }
  try {
    if (!in_step_) begin_step_locked(/*from_hook=*/true);
    if (ready_[param]) {
      throw Error(fmt::format(
          "rank {}: gradient of '{}' arrived twice in one backward. DDP reduces each parameter "
          "once per backward: run one backward per forward (no re-used retain_graph graphs or "
          "parameters reached twice by reentrant backward)",
          group_.rank(), params_[param].name));
    }
    mark_ready_locked(param, /*repoint=*/options_.gradient_as_bucket_view, /*release=*/release_early_);
    used_since_sync_[param] = true;
    launch_ready_locked();
    poll_completions_locked();
  } catch (...) {
    drain_locked();
    throw;
  }
}

// The first hook of a synchronized backward opens the step and asks autograd
// to call finish_step() once the whole graph ran. See Note [End of backward].
// A join (finish_backward()) opens it outside backward and finishes it itself.
void Reducer::begin_step_locked(bool from_hook) {
  in_step_ = true;
  step_start_ = Clock::now();
  next_launch_ = 0;
  next_complete_ = 0;
  current_ = StepStats{};
  current_.buckets.resize(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) current_.buckets[b].bytes = buckets_[b].bytes();
  if (from_hook) torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_step(); });
}

// Copies the parameter's gradient, divided by the group size, into its slot
// (divides in place when .grad already is the slot) and fills the slot. An
// undefined .grad contributes zero. `repoint`: make .grad the slot from now
// on (gradient_as_bucket_view). `release`: reset .grad once copied (Note
// [Releasing gradients early]).
void Reducer::mark_ready_locked(std::size_t param, bool repoint, bool release) {
  const int world = group_.size();
  const Location loc = where_[param];
  Bucket& bucket = buckets_[loc.bucket];
  bucket.acquire();  // a transient buffer: the bucket's first gradient this step
  const at::Tensor& slot = bucket.slot(loc.slot);
  at::Tensor& grad = params_[param].tensor.mutable_grad();
  {
    torch::NoGradGuard no_grad;
    if (!grad.defined()) {
      slot.zero_();
    } else if (!grad.is_same(slot)) {
      if (grad.layout() != at::kStrided) {
        throw Error(fmt::format("rank {}: gradient of '{}' is sparse; the bucketed reducer "
                                "supports dense gradients only",
                                group_.rank(), params_[param].name));
      }
      // Copy and pre-divide in one pass. See Note [Averaging].
      if (world > 1) {
        at::Tensor out = slot;  // same tensor; div_out wants a mutable handle
        at::div_out(out, grad, c10::scalar_to_tensor(at::Scalar(static_cast<double>(world))));
      } else {
        slot.copy_(grad);
      }
      if (repoint) grad = slot;
    } else if (world > 1) {
      slot.div_(world);  // .grad is the slot (gradient_as_bucket_view)
    }
    if (release) grad.reset();
  }
  ready_[param] = true;
  if (bucket.fill(loc.slot)) {
    bucket.mark_ready();
    current_.buckets[loc.bucket].ready_ms = ms_since_start();
  }
}

// Launches ready buckets in index order only: a ready bucket waits for every
// earlier one, so all ranks issue the same collectives in the same order even
// when autograd produces gradients in different orders. See Note [Bucket order].
void Reducer::launch_ready_locked() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].state() == BucketState::kReady) {
    Bucket& bucket = buckets_[next_launch_];  // already pre-divided (mark_ready_locked)
    // Stamp before issuing: on oversubscribed cores the backend's thread may
    // finish the collective before this thread runs again, and a stamp taken
    // after the call would then hide the whole transfer.
    current_.buckets[next_launch_].launched_ms = ms_since_start();
    bucket.launch(sink_->launch(group_, next_launch_, bucket.buffer()));
    ++next_launch_;
  }
}

void Reducer::poll_completions_locked() {
  while (next_complete_ < next_launch_ && buckets_[next_complete_].work_completed()) {
    current_.buckets[next_complete_].completed_ms = completed_ms_locked(next_complete_);
    ++next_complete_;
  }
}

// The backend's own completion stamp when it has one (exact); otherwise now,
// the moment we saw it complete (an upper bound). See Note [Overlap stats].
double Reducer::completed_ms_locked(std::size_t bucket) const {
  if (const auto at = buckets_[bucket].completed_at()) {
    return std::chrono::duration<double, std::milli>(*at - step_start_).count();
  }
  return ms_since_start();
}

// ---- end of backward -------------------------------------------------------

void Reducer::finish_step() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_step_) return;  // the step was abandoned (reset_step) before autograd got here
  try {
    finish_step_locked(/*joining=*/false);
  } catch (...) {
    drain_locked();
    throw;
  }
}

// `joining`: no gradient arrived on this rank at all (finish_backward()).
void Reducer::finish_step_locked(bool joining) {
  const double backward_end = ms_since_start();
  current_.backward_ms = backward_end;
  poll_completions_locked();

  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  if (!missing.empty() && !options_.find_unused_parameters && !joining) {
    throw Error(fmt::format(
        "rank {}: {} parameter(s) received no gradient in this backward: {}. Every rank must "
        "reduce every bucket in every synchronized backward. If the forward does not use every "
        "parameter (conditional branches, frozen heads), set find_unused_parameters = true (DDP: "
        "DdpOptions::reducer; ZeroOptions; FsdpOptions); if a parameter should never train, set "
        "requires_grad(false) on it before wrapping the model",
        group_.rank(), missing.size(), list_names(params_, missing)));
  }
  // See Note [Unused parameters]: contribute the current .grad (zero if none);
  // whether .grad is re-pointed waits for the global verdict (write-back).
  // Not released here: a parameter no rank used keeps its .grad (decided by
  // the verdict below); the others are reset by write_back_locked().
  for (std::size_t i : missing) mark_ready_locked(i, /*repoint=*/false, /*release=*/false);
  launch_ready_locked();
  if (next_launch_ != buckets_.size()) {
    throw Error(fmt::format("rank {}: reducer: only {} of {} buckets launched at the end of "
                            "backward; this is a bug in the reducer",
                            group_.rank(), next_launch_, buckets_.size()));
  }

  at::Tensor used;
  comm::WorkHandle used_work;
  if (options_.find_unused_parameters) {
    std::vector<int32_t> flags(used_since_sync_.begin(), used_since_sync_.end());
    used = torch::tensor(flags, at::TensorOptions().dtype(at::kInt)).to(params_.front().tensor.device());
    used_work = group_.all_reduce(used, comm::ReduceOp::kSum);
  }

  const auto wait_start = Clock::now();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].wait(options_.timeout);
    if (b >= next_complete_) current_.buckets[b].completed_ms = completed_ms_locked(b);
    sink_->reduced(b, buckets_[b].buffer());
    buckets_[b].release();  // transient: the sink consumed it; frees memory before the next wait
  }
  next_complete_ = buckets_.size();
  if (used_work) used_work->wait(options_.timeout);
  current_.wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count();

  write_back_locked(used.defined() ? used.cpu() : used);

  for (Bucket& bucket : buckets_) bucket.reset();
  ready_.assign(ready_.size(), false);
  used_since_sync_.assign(used_since_sync_.size(), false);
  in_step_ = false;
  current_.finalize_ms = ms_since_start() - backward_end;
  last_ = std::move(current_);
  ++synced_steps_;
}

// After the wait every slot holds the average over ranks. .grad tensors that
// are the slot already hold it; the rest get it copied (or are re-pointed,
// with gradient_as_bucket_view). Parameters no rank used keep their .grad.
// A sink that consumed the result (writes_back() false) gets .grad reset
// instead: the full-size local gradient must not outlive the step, and a
// stale one would be mistaken for the average.
void Reducer::write_back_locked(const at::Tensor& globally_used) {
  torch::NoGradGuard no_grad;
  const int32_t* used = globally_used.defined() ? globally_used.data_ptr<int32_t>() : nullptr;
  const bool writes_back = sink_->writes_back();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (used != nullptr && used[i] == 0) continue;
    if (!writes_back) {
      params_[i].tensor.mutable_grad().reset();
      continue;
    }
    const at::Tensor& slot = buckets_[where_[i].bucket].slot(where_[i].slot);
    at::Tensor& grad = params_[i].tensor.mutable_grad();
    if (grad.defined() && grad.is_same(slot)) continue;
    if (options_.gradient_as_bucket_view) {
      grad = slot;
    } else if (grad.defined()) {
      grad.copy_(slot);
    } else {
      grad = slot.clone();
    }
  }
}

// Ends a failed step: waits for what is in flight (peers launched the same
// buckets, so this normally completes), abandons what fails, clears the step.
void Reducer::drain_locked() noexcept {
  for (Bucket& bucket : buckets_) {
    try {
      if (bucket.state() == BucketState::kLaunched) bucket.wait(options_.timeout);
      bucket.reset();
    } catch (...) {
      bucket.abandon();
    }
  }
  ready_.assign(ready_.size(), false);
  used_since_sync_.assign(used_since_sync_.size(), false);
  in_step_ = false;
}

double Reducer::ms_since_start() const {
  return std::chrono::duration<double, std::milli>(Clock::now() - step_start_).count();
}

}  // namespace paratrain::ddp

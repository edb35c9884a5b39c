// The "ddp" strategy (zero.stage = 0): every dp rank holds the whole model;
// gradients are averaged by the bucketed reducer during backward
// (ddp.mode = "bucketed"), by one all-reduce per gradient after it
// ("naive", the twin DDP is tested against), or not at all ("none", one rank).
#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/autocast.h"
#include "paratrain/core/error.h"
#include "paratrain/core/phase.h"
#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/naive.h"
#include "paratrain/data_parallel/ddp/int8_compression.h"
#include "paratrain/data_parallel/ddp/powersgd.h"
#include <spdlog/spdlog.h>
#include "paratrain/models/model.h"
#include "paratrain/optim/clip.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/train/strategies/builtin.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain::train::strategies {
namespace {

class DdpStrategy final : public DataParallelStrategy {
 public:
  explicit DdpStrategy(const StrategyContext& ctx) : DataParallelStrategy(ctx, "ddp") {
    const auto& mode = config_.ddp.mode;
    if (mode == "none" && dp_.size() != 1) {
      throw ConfigError(fmt::format("ddp.mode = \"none\" trains each of the {} ranks on its own; use \"bucketed\" "
                                    "or \"naive\", or run one process",
                                    dp_.size()));
    }
  }

  std::string name() const override {
    const auto& d = config_.ddp;
    if (d.compression == "none") return fmt::format("ddp ({})", d.mode);
    if (d.compression == "powersgd") return fmt::format("ddp ({}, powersgd rank {})", d.mode, d.powersgd_rank);
    return fmt::format("ddp ({}, {} gradients)", d.mode, d.compression);
  }

  void build_model(const ModelFactory& factory) override {
    model_ = factory();
    convert_batchnorm(config_, *model_, dp_, timeout_);
    std::vector<at::Tensor> experts = split_experts();  // parallel.ep > 1 (bucketed only: the schema)
    const auto& d = config_.ddp;
    if (d.mode == "bucketed") {
      ddp::DdpOptions options = ddp_options(config_, timeout_);
      options.local_parameters = std::move(experts);
      // ddp.compression "fp16"/"bf16" is the same wire as precision.comm_dtype
      // (the schema rejects the two disagreeing).
      const std::string wire_name = d.compression == "fp16" || d.compression == "bf16"
                                        ? d.compression
                                        : config_.precision.comm_dtype;
      if (wire_name != "fp32") {
        // Buckets are fp32 and pre-divided; only the wire is 16-bit.
        const auto wire = wire_name == "bf16" ? at::kBFloat16 : at::kHalf;
        options.reducer.comm_hook = ddp::low_precision_hook(wire);
      }
      if (d.compression == "powersgd") {
        ddp::PowerSgdOptions p;
        p.rank = d.powersgd_rank;
        p.start_step = d.powersgd_start_step;
        p.seed = static_cast<uint64_t>(config_.run.seed);
        powersgd_ = std::make_shared<ddp::PowerSgd>(p);
        options.reducer.comm_hook = powersgd_->hook();
        // The hook only runs with the reducer: on one rank there is nothing to compress.
        options.reducer.single_rank_passthrough = true;
      }
      if (d.compression == "int8") {
        int8_ = std::make_shared<ddp::Int8Compression>();
        options.reducer.comm_hook = int8_->hook();
      }
      ddp_ = std::make_unique<ddp::DistributedDataParallel>(model_, dp_, std::move(options));
      if (powersgd_) {
        powersgd_->attach(ddp_->reducer());
        log_powersgd();
      }
      if (int8_) {
        int8_->attach(ddp_->reducer());
        log_int8_wire(*int8_, dp_);
      }
    } else if (d.mode == "naive") {
      ddp::NaiveOptions options;
      options.broadcast_buffers = d.broadcast_buffers;
      options.timeout = timeout_;
      naive_ = std::make_unique<ddp::NaiveDataParallel>(model_, dp_, options);
    }
  }

  std::vector<at::Tensor> optimizer_params() override { return unique_parameters(*model_); }

  StepOutput forward_backward(const data::Batch& batch, const LossFn& loss_fn, bool sync) override {
    std::optional<ddp::DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp_) {
      ddp_->prepare_forward();
      if (!sync) no_sync.emplace(ddp_->reducer());
    }
    if (naive_) naive_->prepare_forward();
    at::Tensor loss;
    {
      PhaseScope phase(kPhaseForward);
      core::AutocastGuard autocast(compute_);
      loss = loss_fn(model_->forward(batch.inputs), batch.targets);
    }
    PhaseScope phase(kPhaseBackward);
    loss.backward();
    if (ddp_ && sync) ddp_->finish_backward();
    if (experts_ && sync) experts_->reduce_gradients();
    // The naive twin all-reduces whatever .grad holds: after unsynchronized
    // backwards, the accumulated sum (mode "none": nothing to reduce).
    if (naive_ && sync) naive_->sync_gradients();
    return {loss.detach()};
  }

  bool optimizer_step(torch::optim::Optimizer& optimizer, double clip_grad_norm,
                      optim::GradScaler* scaler) override {
    // The reduced gradients are the same on every rank, so an inf anywhere
    // before the reduction is seen everywhere; agreeing over dp anyway (4
    // bytes) keeps ranks in step if a rank's gradient changed after it.
    const bool skip = unscale_found_inf(scaler, grads_of(unique_parameters(*model_)), {&dp_}, timeout_);
    if (!skip) {
      // Gradients are the same on every rank after the reduction, so the
      // local norm is the global one; experts' add their ep group's.
      if (clip_grad_norm > 0 && experts_) {
        clip_with_experts(dense_square_sum(), clip_grad_norm, [this](double coef) {
          for (auto& p : unique_parameters(*model_))
            if (!experts_->holds(p) && p.grad().defined()) p.mutable_grad().mul_(coef);
        });
      } else if (clip_grad_norm > 0) {
        optim::clip_grad_norm(unique_parameters(*model_), clip_grad_norm);  // no device sync (optim/clip.h)
      }
      optimizer.step();
    }
    optimizer.zero_grad();
    if (scaler) scaler->update();
    return !skip;
  }

  at::Tensor eval_forward(const at::Tensor& inputs) override {
    // Running statistics (BatchNorm) drift per replica between broadcasts;
    // evaluate rank 0's, as the checkpoint will hold.
    if (ddp_) ddp_->sync_buffers();
    if (naive_) naive_->prepare_forward();
    return model_->forward(inputs);
  }

  // Experts (parallel.ep) are written by their holders in ep group 0.
  std::vector<TensorSlot> model_slots() override {
    auto slots = replicated_slots(*model_, dp_.rank() == 0);
    return experts_ ? experts_->checkpoint_slots(std::move(slots)) : slots;
  }
  std::vector<checkpoint::OptimizerSlot> optimizer_slots() override {
    auto slots = replicated_optimizer_slots(*model_, dp_.rank() == 0);
    if (experts_) {
      for (auto& s : slots) s.slot = experts_->checkpoint_slots({s.slot}).front();
    }
    return slots;
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override { return whole_parameters(); }

  // PowerSGD's error feedback, Q and step count (Note [PowerSGD state in
  // checkpoints], data_parallel/ddp/powersgd_state.cpp); the int8 wire's
  // residuals (Note [Int8 wire state in checkpoints]).
  std::vector<TensorSlot> state_slots() override {
    if (int8_) return int8_->state_slots(dp_.rank(), dp_.size());
    return powersgd_ ? powersgd_->state_slots(dp_.rank(), dp_.size()) : std::vector<TensorSlot>{};
  }
  void state_loaded(const std::vector<std::string>& missing) override {
    if (powersgd_) powersgd_->state_loaded(missing);
    if (int8_) int8_->state_loaded(missing);
  }

  SyncStats last_stats() const override {
    return ddp_ ? sync_stats(ddp_->last_step_stats()) : SyncStats{};
  }

  ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const override {
    std::vector<at::Tensor> grads;
    const std::vector<at::Tensor> params = unique_parameters(*model_);
    for (const auto& p : params) grads.push_back(p.grad());
    ModelStateBytes m;
    m.params = tensor_bytes(params);
    m.grads = tensor_bytes(grads);
    m.optimizer_state = tensor_bytes(optimizer_state_tensors(optimizer));
    return m;
  }

 private:
  // The dense gradients' square sum (the same on every rank after the
  // reduction).
  double dense_square_sum() const {
    double sum = 0;
    for (const auto& p : unique_parameters(*model_)) {
      if (!experts_->holds(p) && p.grad().defined()) sum += p.grad().to(at::kDouble).square().sum().item<double>();
    }
    return sum;
  }

  void log_powersgd() const {
    if (dp_.rank() != 0) return;
    const int64_t sent = powersgd_->floats_sent_per_step(), full = powersgd_->floats_uncompressed_per_step();
    spdlog::info("PowerSGD rank {}: {} of {} gradient floats sent per step ({:.1f}x less), uncompressed for "
                 "the first {} steps",
                 config_.ddp.powersgd_rank, sent, full,
                 sent > 0 ? static_cast<double>(full) / static_cast<double>(sent) : 1.0,
                 config_.ddp.powersgd_start_step);
  }

  std::unique_ptr<ddp::DistributedDataParallel> ddp_;
  std::shared_ptr<ddp::PowerSgd> powersgd_;
  std::shared_ptr<ddp::Int8Compression> int8_;
  std::unique_ptr<ddp::NaiveDataParallel> naive_;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp_strategy(const StrategyContext& context) {
  return std::make_unique<DdpStrategy>(context);
}

}  // namespace paratrain::train::strategies

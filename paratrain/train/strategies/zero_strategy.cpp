// The "zero" strategy (zero.stage = 1 or 2): ZeroDataParallel over the dp
// group. Every rank keeps full parameters; the optimizer steps this rank's
// shard pieces, whose state is all that is saved for them.
#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/autocast.h"
#include "paratrain/core/phase.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/models/model.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/train/strategies/builtin.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain::train::strategies {
namespace {

class ZeroStrategy final : public DataParallelStrategy {
 public:
  explicit ZeroStrategy(const StrategyContext& ctx) : DataParallelStrategy(ctx, "zero") {
    check_bucketed_mode(config_, "zero");
  }

  std::string name() const override {
    const std::string wire = wire_name();
    if (wire == "fp32") return fmt::format("zero (stage {})", config_.zero.stage);
    return fmt::format("zero (stage {}, {} gradients)", config_.zero.stage, wire);
  }

  void build_model(const ModelFactory& factory) override {
    model_ = factory();
    convert_batchnorm(config_, *model_, dp_, timeout_);
    zero::ZeroOptions options = zero_options(config_, timeout_);
    // parallel.ep > 1: the experts stay whole, each ep rank steps its own
    // (Note [Experts in the data-parallel mesh], moe/expert_parallel.h).
    options.local_parameters = split_experts();
    // ddp.compression "fp16"/"bf16" and precision.comm_dtype name the same
    // wire (the schema rejects the two disagreeing, and powersgd here).
    const std::string wire = wire_name();
    if (wire == "int8") {
      // Attached by ZeroDataParallel's constructor.
      int8_ = std::make_shared<ddp::Int8Compression>();
      options.int8_wire = int8_;
    } else if (wire != "fp32") {
      options.comm_wire = wire == "bf16" ? at::kBFloat16 : at::kHalf;
    }
    zero_ = std::make_unique<zero::ZeroDataParallel>(model_, dp_, std::move(options));
    if (int8_) log_int8_wire(*int8_, dp_);
  }

  std::vector<at::Tensor> optimizer_params() override {
    std::vector<at::Tensor> params = zero_->optimizer_params();
    if (experts_) params.insert(params.end(), experts_->parameters().begin(), experts_->parameters().end());
    return params;
  }
  LayerwiseParams layerwise_params() override {
    return sharded_layerwise_params(dp_, *model_, zero_->optimizer_param_slots());
  }

  StepOutput forward_backward(const data::Batch& batch, const LossFn& loss_fn, bool sync) override {
    zero_->prepare_forward();
    std::optional<zero::ZeroDataParallel::NoSyncGuard> no_sync;
    if (!sync) no_sync.emplace(zero_->reducer());
    at::Tensor loss;
    {
      PhaseScope phase(kPhaseForward);
      core::AutocastGuard autocast(compute_);
      loss = loss_fn(model_->forward(batch.inputs), batch.targets);
    }
    PhaseScope phase(kPhaseBackward);
    loss.backward();
    if (sync) zero_->finish_backward();
    if (sync && experts_) experts_->reduce_gradients();
    return {loss.detach()};
  }

  bool optimizer_step(torch::optim::Optimizer& optimizer, double clip_grad_norm,
                      optim::GradScaler* scaler) override {
    // Each rank holds only its shard's gradients (stage 2; stage 1 reads its
    // slice of the full .grad), so the inf flag is agreed over dp.
    zero_->finish_backward();
    const bool skip = unscale_found_inf(scaler, grads_of(optimizer_params()), {&dp_}, timeout_);
    if (!skip) {
      if (clip_grad_norm > 0 && experts_) {
        at::Tensor dense = at::full({1}, zero_->local_grad_square_sum(), at::kDouble);
        dp_.all_reduce(dense, comm::ReduceOp::kSum)->wait(timeout_);
        clip_with_experts(dense.item<double>(), clip_grad_norm, [this](double coef) { zero_->scale_gradients(coef); });
      } else if (clip_grad_norm > 0) {
        zero_->clip_grad_norm(clip_grad_norm);
      }
      zero_->step(optimizer);  // steps the shard (and this rank's experts), then all-gathers parameters
    }
    // The experts' .grad are whole tensors outside ZeRO's buffers.
    if (experts_) {
      for (auto p : experts_->parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
    }
    // A skipped step leaves parameters as they are (no all-gather needed);
    // the next prepare_forward() clears stage 1's full .grad and stage 2's
    // reduce-scatter overwrites the shards.
    if (scaler) scaler->update();
    return !skip;
  }

  at::Tensor eval_forward(const at::Tensor& inputs) override {
    zero_->prepare_forward();  // buffers from rank 0, as DDP
    return model_->forward(inputs);
  }

  std::vector<TensorSlot> model_slots() override {
    std::vector<TensorSlot> slots = zero_->parameter_slots();
    for (auto& slot : expert_slots()) slots.push_back(std::move(slot));
    return with_replicated_slots(std::move(slots));
  }
  std::vector<checkpoint::OptimizerSlot> optimizer_slots() override {
    std::vector<checkpoint::OptimizerSlot> out;
    for (auto& [param, slot] : zero_->optimizer_param_slots()) out.push_back(checkpoint::OptimizerSlot{param, slot});
    for (auto& slot : expert_slots()) out.push_back(checkpoint::OptimizerSlot{slot.local, slot});
    return out;
  }
  void after_load() override { zero_->after_load(); }
  // The int8 wire's residuals (Note [Int8 wire state in checkpoints]).
  std::vector<TensorSlot> state_slots() override {
    return int8_ ? int8_->state_slots(dp_.rank(), dp_.size()) : std::vector<TensorSlot>{};
  }
  void state_loaded(const std::vector<std::string>& missing) override {
    if (int8_) int8_->state_loaded(missing);
  }
  std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const override {
    return {{"zero.stage", std::to_string(config_.zero.stage)}, {"dp", std::to_string(dp_.size())}};
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override { return whole_parameters(); }

  SyncStats last_stats() const override {
    return sync_stats(zero_->reducer().last_step());
  }

  ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const override {
    ModelStateBytes m = zero_->model_state_bytes(&optimizer);
    if (experts_) {  // whole tensors beside the shards
      m.params += tensor_bytes(experts_->local_parameters());
      m.grads += tensor_bytes(grads_of(experts_->parameters()));
    }
    return m;
  }

 private:
  std::string wire_name() const {
    const auto& c = config_.ddp.compression;
    return c == "fp16" || c == "bf16" || c == "int8" ? c : config_.precision.comm_dtype;
  }
  std::unique_ptr<zero::ZeroDataParallel> zero_;
  std::shared_ptr<ddp::Int8Compression> int8_;
};

}  // namespace

std::unique_ptr<Strategy> make_zero_strategy(const StrategyContext& context) {
  return std::make_unique<ZeroStrategy>(context);
}

}  // namespace paratrain::train::strategies

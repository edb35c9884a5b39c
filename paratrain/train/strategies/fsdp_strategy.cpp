// The "fsdp" strategy (zero.stage = 3): FullyShardedDataParallel over the dp
// group. Parameters live as shards between uses; units are gathered for
// forward and backward (training and evaluation alike).
#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/autocast.h"
#include "paratrain/core/phase.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/models/model.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/train/strategies/builtin.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain::train::strategies {
namespace {

class FsdpStrategy final : public DataParallelStrategy {
 public:
  explicit FsdpStrategy(const StrategyContext& ctx) : DataParallelStrategy(ctx, "fsdp") {
    check_bucketed_mode(config_, "fsdp");
  }

  std::string name() const override {
    return fmt::format("fsdp (zero stage 3, {} units)", fsdp_ ? fsdp_->units().size() : 0);
  }

  void build_model(const ModelFactory& factory) override {
    model_ = factory();
    convert_batchnorm(config_, *model_, dp_, timeout_);
    fsdp_ = std::make_unique<fsdp::FullyShardedDataParallel>(model_, dp_, fsdp_options(config_, timeout_));
  }

  std::vector<at::Tensor> optimizer_params() override { return fsdp_->optimizer_params(); }
  LayerwiseParams layerwise_params() override {
    std::vector<std::pair<at::Tensor, TensorSlot>> pieces;
    for (const auto& slot : optimizer_slots()) pieces.emplace_back(slot.param, slot.slot);
    return sharded_layerwise_params(dp_, *model_, pieces);
  }

  StepOutput forward_backward(const data::Batch& batch, const LossFn& loss_fn, bool sync) override {
    std::optional<fsdp::FullyShardedDataParallel::NoSyncGuard> no_sync;
    if (!sync) no_sync.emplace(*fsdp_);
    at::Tensor loss;
    {
      PhaseScope phase(kPhaseForward);
      core::AutocastGuard autocast(compute_);
      auto output = fsdp_->forward([&] { return model_->forward(batch.inputs); });
      loss = loss_fn(output, batch.targets);
    }
    PhaseScope phase(kPhaseBackward);
    loss.backward();
    fsdp_->finish_backward();
    return {loss.detach()};
  }

  bool optimizer_step(torch::optim::Optimizer& optimizer, double clip_grad_norm,
                      optim::GradScaler* scaler) override {
    // Gradients are shards: the inf flag is agreed over dp.
    const bool skip = unscale_found_inf(scaler, grads_of(fsdp_->optimizer_params()), {&dp_}, timeout_);
    if (!skip) {
      if (clip_grad_norm > 0) fsdp_->clip_grad_norm(clip_grad_norm);
      fsdp_->step(optimizer);
    } else {
      fsdp_->reshard();  // as step() would: free units gathered for backward
    }
    optimizer.zero_grad();
    if (scaler) scaler->update();
    return !skip;
  }

  at::Tensor eval_forward(const at::Tensor& inputs) override {
    return fsdp_->forward([&] { return model_->forward(inputs); });
  }

  std::vector<TensorSlot> model_slots() override { return with_replicated_slots(fsdp_->parameter_slots()); }
  std::vector<checkpoint::OptimizerSlot> optimizer_slots() override {
    auto params = fsdp_->optimizer_params();
    auto slots = fsdp_->parameter_slots();
    std::vector<checkpoint::OptimizerSlot> out;
    for (size_t i = 0; i < params.size(); ++i) out.push_back(checkpoint::OptimizerSlot{params[i], slots.at(i)});
    return out;
  }
  void after_load() override { fsdp_->after_load(); }
  std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const override {
    return {{"zero.stage", "3"}, {"dp", std::to_string(dp_.size())}};
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override { return fsdp_->full_parameters(); }

  ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const override {
    return fsdp_->model_state_bytes(&optimizer);
  }

 private:
  std::unique_ptr<fsdp::FullyShardedDataParallel> fsdp_;
};

}  // namespace

std::unique_ptr<Strategy> make_fsdp_strategy(const StrategyContext& context) {
  return std::make_unique<FsdpStrategy>(context);
}

}  // namespace paratrain::train::strategies

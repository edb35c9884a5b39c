// Test helpers for ZeRO: see zero_training.h.
#include "tests/zero/zero_training.h"

#include <torch/torch.h>

#include "tests/support/multi_rank.h"

namespace paratrain::zero::testing {
namespace {

constexpr double kSgdLr = 0.05;
constexpr double kMomentum = 0.9;
constexpr double kAdamLr = 0.01;
constexpr double kWeightDecay = 0.1;

at::Tensor loss_of(models::Model& model, const at::Tensor& x, const at::Tensor& y) {
  return torch::nn::functional::cross_entropy(model.forward(x), y);
}

}  // namespace

const char* to_string(Optim optim) {
  switch (optim) {
    case Optim::kSgd: return "Sgd";
    case Optim::kAdam: return "Adam";
    case Optim::kAdamW: return "AdamW";
  }
  return "?";
}

ddp::testing::SgdConfig sgd_config() { return {.lr = kSgdLr, .momentum = kMomentum}; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optim optim, std::vector<at::Tensor> params) {
  switch (optim) {
    case Optim::kSgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(kSgdLr).momentum(kMomentum));
    case Optim::kAdam: return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(kAdamLr));
    case Optim::kAdamW:
      return std::make_unique<torch::optim::AdamW>(params,
                                                   torch::optim::AdamWOptions(kAdamLr).weight_decay(kWeightDecay));
  }
  return nullptr;
}

Snapshot train_oracle(const Training& t, const Problem& problem, std::vector<double>* norms) {
  auto model = ddp::testing::make_model(t.model, t.seed);
  auto opt = make_optimizer(t.optim, model->parameters());
  for (int step = 0; step < problem.steps; ++step) {
    auto loss = loss_of(*model, problem.batch_inputs(step), problem.batch_targets(step));
    opt->zero_grad();
    loss.backward();
    if (t.clip > 0) {
      const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), t.clip, t.norm_type);
      if (norms) norms->push_back(norm);
    }
    opt->step();
  }
  return ddp::testing::snapshot(*model);
}

ZeroResult train_zero(const Training& t, const ZeroRun& run, const Problem& problem) {
  ZeroResult result;
  result.params.resize(run.world);
  result.state.resize(run.world);
  result.shard_numel.resize(run.world);
  result.bucket_numel.resize(run.world);
  paratrain::testing::run_ranks(run.world, [&](comm::ProcessGroup& group) {
    const int rank = group.rank();
    auto model = ddp::testing::make_model(t.model, t.seed + rank);
    ZeroDataParallel zero(model, group, run.zero);
    auto opt = make_optimizer(t.optim, zero.optimizer_params());
    for (int step = 0; step < problem.steps; ++step) {
      const at::Tensor x = ddp::testing::shard(problem.batch_inputs(step), rank, run.world);
      const at::Tensor y = ddp::testing::shard(problem.batch_targets(step), rank, run.world);
      const int64_t micro = x.size(0) / run.accumulate;
      TORCH_CHECK(micro * run.accumulate == x.size(0), "shard of ", x.size(0), " rows does not split into ",
                  run.accumulate, " micro-batches");
      {
        auto guard = zero.no_sync();
        for (int m = 0; m + 1 < run.accumulate; ++m) {
          zero.prepare_forward();
          (loss_of(*model, x.narrow(0, m * micro, micro), y.narrow(0, m * micro, micro)) / run.accumulate)
              .backward();
        }
      }
      const int64_t last = (run.accumulate - 1) * micro;
      zero.prepare_forward();
      (loss_of(*model, x.narrow(0, last, micro), y.narrow(0, last, micro)) / run.accumulate).backward();
      if (t.clip > 0) {
        const double norm = zero.clip_grad_norm(t.clip, t.norm_type).item<double>();
        if (rank == 0) result.norms.push_back(norm);
      }
      if (run.skip_gather) {
        zero.finish_backward();
        opt->step();
      } else {
        zero.step(*opt);
      }
      if (run.set_grads_to_none) {
        for (auto& p : zero.optimizer_params()) p.mutable_grad().reset();
        for (auto& p : model->parameters()) p.mutable_grad().reset();
      } else {
        opt->zero_grad();
      }
    }
    result.params[rank] = ddp::testing::snapshot(*model);
    result.state[rank] = zero.model_state_bytes(opt.get());
    int64_t numel = 0;
    for (const auto& p : zero.optimizer_params()) numel += p.numel();
    result.shard_numel[rank] = numel;
    for (const auto& plan : zero.reducer().plans()) result.bucket_numel[rank] += plan.padded_numel;
  });
  return result;
}

}  // namespace paratrain::zero::testing

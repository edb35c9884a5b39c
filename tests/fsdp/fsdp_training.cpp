// Test helpers for FSDP: see fsdp_training.h.
#include "tests/fsdp/fsdp_training.h"

#include <torch/torch.h>

#include "tests/support/multi_rank.h"

namespace paratrain::fsdp::testing {
namespace {

at::Tensor loss_of(torch::nn::Module& module, const at::Tensor& x, const at::Tensor& y) {
  auto& model = dynamic_cast<models::Model&>(module);
  return torch::nn::functional::cross_entropy(model.forward(x), y);
}

}  // namespace

const char* to_string(Opt opt) {
  switch (opt) {
    case Opt::kSgd: return "Sgd";
    case Opt::kAdam: return "Adam";
    case Opt::kAdamW: return "AdamW";
  }
  return "?";
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<at::Tensor> params) {
  switch (opt) {
    case Opt::kSgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
    case Opt::kAdam:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
    case Opt::kAdamW:
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01));
  }
  return nullptr;
}

Snapshot train_oracle(ModelKind kind, const Problem& problem, uint64_t seed, const OracleOptions& options) {
  auto model = ddp::testing::make_model(kind, seed);
  auto opt = make_optimizer(options.opt, model->parameters());
  for (int step = 0; step < problem.steps; ++step) {
    auto loss = loss_of(*model, problem.batch_inputs(step), problem.batch_targets(step));
    opt->zero_grad();
    loss.backward();
    if (options.clip > 0) {
      const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), options.clip);
      if (options.norms) options.norms->push_back(norm);
    }
    opt->step();
  }
  return ddp::testing::snapshot(*model);
}

std::vector<RankResult> train_fsdp(const FsdpRun& run, const Problem& problem) {
  std::vector<RankResult> result(run.world);
  paratrain::testing::run_ranks(run.world, [&](comm::ProcessGroup& world_group) {
    std::unique_ptr<comm::ProcessGroup> wrapped;
    if (run.wrap_group) wrapped = run.wrap_group(world_group);
    comm::ProcessGroup& group = wrapped ? *wrapped : world_group;
    const int rank = group.rank();
    auto model = ddp::testing::make_model(run.model, run.seed + rank);
    FullyShardedDataParallel fsdp(model, group, run.fsdp);
    auto opt = make_optimizer(run.opt, fsdp.optimizer_params());
    for (int step = 0; step < problem.steps; ++step) {
      const auto x = ddp::testing::shard(problem.batch_inputs(step), rank, run.world);
      const auto y = ddp::testing::shard(problem.batch_targets(step), rank, run.world);
      opt->zero_grad();
      // Micro-batch m is rows [m*b, (m+1)*b) of this rank's shard; each loss
      // is scaled by 1/accumulate so the sum is the shard's mean.
      const int64_t b = x.size(0) / run.accumulate;
      for (int m = 0; m < run.accumulate; ++m) {
        auto micro = [&] {
          fsdp.prepare_forward();
          auto loss = loss_of(*model, x.narrow(0, m * b, b), y.narrow(0, m * b, b)) / run.accumulate;
          loss.backward();
          fsdp.finish_backward();
        };
        if (m + 1 < run.accumulate) {
          auto guard = fsdp.no_sync();
          micro();
        } else {
          micro();
        }
      }
      if (run.clip > 0) result[rank].norms.push_back(fsdp.clip_grad_norm(run.clip).item<double>());
      fsdp.step(*opt);
    }
    if (run.inspect) run.inspect(fsdp, *opt, rank);
    result[rank].params = fsdp.full_parameters();
    result[rank].stats = fsdp.stats();
  });
  return result;
}

}  // namespace paratrain::fsdp::testing

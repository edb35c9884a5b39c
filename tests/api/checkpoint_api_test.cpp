// The public checkpoint calls (api/checkpoint.h) on a user's own module:
// Adam trained under FSDP on 2 ranks, saved, loads into a DDP-wrapped copy
// on 2 ranks, into ZeRO-2, and into a plain module in one process, with the
// same weights and Adam state (the next step agrees too).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/paratrain.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(6, 10))), fc2(register_module("fc2", torch::nn::Linear(10, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// The same initial weights on every rank thread (the default generator is shared).
Net make_net() {
  return paratrain::testing::seeded(5, [] { return Net(); });
}

torch::Tensor inputs() { return torch::linspace(-1, 1, 8 * 6).reshape({8, 6}); }
torch::Tensor targets() { return torch::tensor({0, 1, 2, 0, 1, 2, 0, 1}, torch::kLong); }

// One step on rank `rank`'s half of the 8 rows (or all rows in one process).
torch::Tensor loss_of(Net& net, int rank, int size) {
  const int64_t n = 8 / size;
  return torch::cross_entropy_loss(net->forward(inputs().slice(0, rank * n, rank * n + n)),
                                   targets().slice(0, rank * n, rank * n + n));
}

std::map<std::string, at::Tensor> named(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

void expect_same(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a)
    EXPECT_TRUE(torch::allclose(t, b.at(name), 1e-5, 1e-7)) << name;
}

TEST(CheckpointApi, FsdpCheckpointLoadsIntoDdpZeroAndOneProcess) {
  const std::string dir = paratrain::testing::temp_dir("api-ckpt") + "/step";
  std::map<std::string, at::Tensor> saved, after_next_step;
  paratrain::testing::run_ranks(2, [&](paratrain::ProcessGroup& g) {
    auto net = make_net();
    paratrain::FsdpOptions o;
    o.unit_min_params = 0;
    paratrain::FullyShardedDataParallel fsdp(net.ptr(), g, o);
    torch::optim::Adam opt(fsdp.optimizer_params(), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 3; ++step) {
      fsdp.prepare_forward();
      auto loss = loss_of(net, g.rank(), 2);
      opt.zero_grad();
      loss.backward();
      fsdp.step(opt);
    }
    paratrain::save_checkpoint(dir, fsdp, &opt, 3);
    auto full = fsdp.full_parameters();
    // One more step: a loaded copy must take the same one (Adam state restored).
    fsdp.prepare_forward();
    auto loss = loss_of(net, g.rank(), 2);
    opt.zero_grad();
    loss.backward();
    fsdp.step(opt);
    auto next = fsdp.full_parameters();
    if (g.rank() == 0) {
      for (auto& [k, v] : full) saved[k] = v;
      for (auto& [k, v] : next) after_next_step[k] = v;
    }
  });

  // DDP on 2 ranks: the same weights, and the same next step.
  paratrain::testing::run_ranks(2, [&](paratrain::ProcessGroup& g) {
    auto net = make_net();
    paratrain::DistributedDataParallel ddp(net.ptr(), g);
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.01));
    EXPECT_EQ(paratrain::load_checkpoint(dir, ddp, &opt), 3);
    expect_same(named(*net), saved);
    ddp.prepare_forward();
    auto loss = loss_of(net, g.rank(), 2);
    opt.zero_grad();
    loss.backward();
    ddp.finish_backward();
    opt.step();
    expect_same(named(*net), after_next_step);
  });

  // ZeRO-2 on 2 ranks: loading regathers the full parameters everywhere.
  paratrain::testing::run_ranks(2, [&](paratrain::ProcessGroup& g) {
    auto net = make_net();
    paratrain::ZeroOptions options;
    options.stage = 2;
    paratrain::ZeroDataParallel zero(net.ptr(), g, options);
    torch::optim::Adam opt(zero.optimizer_params(), torch::optim::AdamOptions(0.01));
    paratrain::load_checkpoint(dir, zero, &opt);
    expect_same(named(*net), saved);
  });

  // One process, no wrapper.
  auto net = make_net();
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.01));
  paratrain::load_checkpoint(dir, *net, &opt);
  expect_same(named(*net), saved);
}

}  // namespace

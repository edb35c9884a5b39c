// One protocol for the three data-parallel wrappers a C++ user wraps their own
// module in: DistributedDataParallel, ZeroDataParallel (stages 1 and 2) and
// FullyShardedDataParallel take the same loop (step(optimizer) after each
// synchronized backward, no_sync() around the micro-batches of an
// accumulation that only accumulate; prepare_forward() before a forward
// optional, since the constructor and step() prepare the next one), and with
// it train at 2 ranks what one process trains on the global batch, with or
// without prepare_forward(). A rank whose loss reaches no parameter joins its
// peers in step() with no other call. Stepping inside no_sync() is an error
// naming it, on every wrapper, instead of replicas that silently drift apart.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "paratrain/paratrain.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace {

// A user's module with two outputs and its own loss; nothing paratrain in it.
struct TwoOutNetImpl : torch::nn::Module {
  TwoOutNetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))), fc2(register_module("fc2", torch::nn::Linear(16, 2))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoOutNet);

TwoOutNet make_net() {
  return paratrain::testing::seeded(11, [] { return TwoOutNet(); });
}

constexpr int64_t kGlobal = 16, kSteps = 6, kMicro = 2;
torch::Tensor xs() { return torch::linspace(-2, 2, kGlobal * kSteps * 8).reshape({kGlobal * kSteps, 8}).sin(); }
torch::Tensor ys() { return torch::linspace(-1, 1, kGlobal * kSteps * 2).reshape({kGlobal * kSteps, 2}).cos(); }

// The user's loss: squared error on output 0 plus absolute error on output 1.
torch::Tensor user_loss(const torch::Tensor& out, const torch::Tensor& y) {
  return (out.select(1, 0) - y.select(1, 0)).square().mean() + 0.5 * (out.select(1, 1) - y.select(1, 1)).abs().mean();
}

std::map<std::string, at::Tensor> reference() {
  auto net = make_net();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int64_t s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    user_loss(net->forward(xs().slice(0, s * kGlobal, (s + 1) * kGlobal)), ys().slice(0, s * kGlobal, (s + 1) * kGlobal)).backward();
    opt.step();
  }
  std::map<std::string, at::Tensor> out;
  for (auto& p : net->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// The one loop, for any wrapper W: rank r's half of each global batch in
// kMicro micro-batches, the first ones under no_sync().
template <typename W>
void train(W& wrapper, TwoOutNet& net, torch::optim::Optimizer& opt, int rank, int size, bool prepare) {
  const int64_t per_rank = kGlobal / size, micro = per_rank / kMicro;
  for (int64_t s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const int64_t first = s * kGlobal + rank * per_rank;
    auto micro_step = [&](int64_t m) {
      if (prepare) wrapper.prepare_forward();
      const int64_t a = first + m * micro;
      (user_loss(net->forward(xs().slice(0, a, a + micro)), ys().slice(0, a, a + micro)) / kMicro).backward();
    };
    {
      auto only_accumulate = wrapper.no_sync();
      for (int64_t m = 0; m + 1 < kMicro; ++m) micro_step(m);
    }
    micro_step(kMicro - 1);
    wrapper.step(opt);
  }
}

void expect_equal(const std::map<std::string, at::Tensor>& got, const std::map<std::string, at::Tensor>& want,
                  const std::string& who) {
  ASSERT_EQ(got.size(), want.size()) << who;
  for (const auto& [name, w] : want) {
    const double diff = (got.at(name) - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-12);
    // float32 sums of 2 ranks' halves vs one process: ~1e-7 after 6 steps.
    EXPECT_LT(diff, 1e-5) << who << " " << name;
  }
}

std::map<std::string, at::Tensor> named(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST(WrapperProtocol, DdpZeroAndFsdpTrainTheSameLoopEqualToOneProcess) {
  const auto want = reference();
  for (const bool prepare : {true, false})
  for (const std::string kind : {"ddp", "zero1", "zero2", "fsdp"}) {
    std::map<std::string, at::Tensor> got;
    paratrain::testing::run_ranks(2, [&](paratrain::ProcessGroup& g) {
      auto net = make_net();
      std::map<std::string, at::Tensor> mine;
      if (kind == "ddp") {
        paratrain::DistributedDataParallel w(net.ptr(), g);
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
        train(w, net, opt, g.rank(), g.size(), prepare);
        mine = named(*net);
      } else if (kind == "fsdp") {
        paratrain::FsdpOptions o;
        o.unit_min_params = 0;
        paratrain::FullyShardedDataParallel w(net.ptr(), g, o);
        torch::optim::SGD opt(w.optimizer_params(), torch::optim::SGDOptions(0.05).momentum(0.9));
        train(w, net, opt, g.rank(), g.size(), prepare);
        for (auto& [name, t] : w.full_parameters()) mine[name] = t.clone();
      } else {
        paratrain::ZeroOptions o;
        o.stage = kind == "zero1" ? 1 : 2;
        paratrain::ZeroDataParallel w(net.ptr(), g, o);
        torch::optim::SGD opt(w.optimizer_params(), torch::optim::SGDOptions(0.05).momentum(0.9));
        train(w, net, opt, g.rank(), g.size(), prepare);
        mine = named(*net);
      }
      if (g.rank() == 1) got = mine;
    });
    expect_equal(got, want, kind + (prepare ? " with prepare_forward()" : " with step() only"));
  }
  // Negative control: rank 1 stepping on its own half (no wrapper, the
  // gradients never averaged) is told apart.
  auto alone = make_net();
  torch::optim::SGD opt(alone->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int64_t s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    const int64_t a = s * kGlobal + kGlobal / 2;
    user_loss(alone->forward(xs().slice(0, a, a + kGlobal / 2)), ys().slice(0, a, a + kGlobal / 2)).backward();
    opt.step();
  }
  const auto local = named(*alone);
  double worst = 0;
  for (const auto& [name, w] : want) worst = std::max(worst, (local.at(name) - w).abs().max().item<double>());
  EXPECT_GT(worst, 1e-3);
}

// A rank whose loss reaches no parameter (no data this step) fires no
// gradient hook; with only step() in the loop, DDP and ZeRO-1/2 join the
// peers' collectives with zero gradients instead of leaving them waiting,
// and the replicas stay equal.
TEST(WrapperProtocol, ARankWhoseLossReachesNoParameterJoinsInStepAlone) {
  for (const std::string kind : {"ddp", "zero1", "zero2"}) {
    std::vector<std::map<std::string, at::Tensor>> got(2);
    paratrain::testing::run_ranks(2, [&](paratrain::ProcessGroup& g) {
      auto net = make_net();
      auto loop = [&](auto& w, torch::optim::Optimizer& opt) {
        for (int64_t s = 0; s < 3; ++s) {
          opt.zero_grad();
          const int64_t a = s * kGlobal + g.rank() * (kGlobal / 2);
          torch::Tensor loss = (g.rank() == 1 && s == 1)
                                   ? torch::zeros({}, torch::requires_grad())  // reaches no parameter
                                   : user_loss(net->forward(xs().slice(0, a, a + kGlobal / 2)),
                                               ys().slice(0, a, a + kGlobal / 2));
          loss.backward();
          w.step(opt);
        }
      };
      if (kind == "ddp") {
        paratrain::DistributedDataParallel w(net.ptr(), g);
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
        loop(w, opt);
      } else {
        paratrain::ZeroOptions o;
        o.stage = kind == "zero1" ? 1 : 2;
        paratrain::ZeroDataParallel w(net.ptr(), g, o);
        torch::optim::SGD opt(w.optimizer_params(), torch::optim::SGDOptions(0.05));
        loop(w, opt);
      }
      got[g.rank()] = named(*net);
    }, std::chrono::seconds(30));
    expect_equal(got[1], got[0], kind + ": replicas after a join");
  }
}

// Stepping inside no_sync() would step on this rank's own gradients: named
// on every wrapper, on every rank, and no rank waits on another.
TEST(WrapperProtocol, StepInsideNoSyncIsAnErrorNamingIt) {
  for (const std::string kind : {"ddp", "zero2", "fsdp"}) {
    paratrain::testing::run_ranks(2, [&](paratrain::ProcessGroup& g) {
      auto net = make_net();
      auto misuse = [&](auto& w, torch::optim::Optimizer& opt) {
        auto guard = w.no_sync();
        w.prepare_forward();
        user_loss(net->forward(xs().slice(0, 4)), ys().slice(0, 4)).backward();
        try {
          w.step(opt);
          ADD_FAILURE() << kind << ": step() inside no_sync() was accepted";
        } catch (const paratrain::Error& e) {
          EXPECT_NE(std::string(e.what()).find("no_sync()"), std::string::npos) << kind << ": " << e.what();
        }
      };
      if (kind == "ddp") {
        paratrain::DistributedDataParallel w(net.ptr(), g);
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
        misuse(w, opt);
      } else if (kind == "fsdp") {
        paratrain::FullyShardedDataParallel w(net.ptr(), g);
        torch::optim::SGD opt(w.optimizer_params(), torch::optim::SGDOptions(0.05));
        misuse(w, opt);
      } else {
        paratrain::ZeroOptions o;
        o.stage = 2;
        paratrain::ZeroDataParallel w(net.ptr(), g, o);
        torch::optim::SGD opt(w.optimizer_params(), torch::optim::SGDOptions(0.05));
        misuse(w, opt);
      }
    });
  }
}

}  // namespace

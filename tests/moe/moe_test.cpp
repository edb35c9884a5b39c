// The mixture-of-experts layer (paratrain/moe/moe.h): against a loop over
// tokens and experts written here (top-1 and top-2, the capacity's drops,
// the aux loss), and with the experts over 2 and 4 ranks (ep = dp, and
// ep = 2 inside dp = 4) against one process holding every expert: outputs
// and gradients equal, with and without drops (the same tokens dropped);
// moe::ExpertParallel splitting a program's model built whole.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <mutex>

#include "paratrain/core/error.h"
#include "paratrain/core/loss_weight.h"
#include "paratrain/moe/expert_parallel.h"
#include "paratrain/moe/moe.h"
#include "paratrain/topology/device_mesh.h"
#include "tests/support/multi_rank.h"

namespace paratrain::moe {
namespace {

constexpr int64_t kD = 16, kE = 4, kTokensPerRank = 24;

std::shared_ptr<Moe> build(MoeOptions o) {
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  torch::manual_seed(5);
  return std::make_shared<Moe>(o);
}

MoeOptions options(int64_t top_k, double capacity_factor) {
  MoeOptions o;
  o.d_model = kD;
  o.hidden = 24;
  o.experts = kE;
  o.top_k = top_k;
  o.capacity_factor = capacity_factor;
  o.timeout = std::chrono::seconds(60);
  return o;
}

at::Tensor tokens(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randn({n, kD}, gen);
}

// The layer written out: slots in order (every first choice in token order,
// then every second), each token's kept choices summed with their gates.
struct Hand {
  at::Tensor y, aux;
  int64_t dropped = 0, without = 0;
};
Hand hand_moe(Moe& moe, const at::Tensor& x) {
  torch::NoGradGuard no_grad;
  const auto& o = moe.options();
  const int64_t n = x.size(0), k = o.top_k;
  const at::Tensor probs = torch::softmax(x.matmul(moe.router->weight.t()), -1);
  const int64_t capacity = static_cast<int64_t>(std::ceil(o.capacity_factor * k * n / static_cast<double>(kE)));
  std::vector<std::vector<int64_t>> pick(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<std::pair<float, int64_t>> order;
    for (int64_t e = 0; e < kE; ++e) order.emplace_back(probs[t][e].item<float>(), e);
    std::stable_sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (int64_t j = 0; j < k; ++j) pick[static_cast<size_t>(t)].push_back(order[static_cast<size_t>(j)].second);
  }
  std::vector<int64_t> used(kE, 0);
  std::vector<std::vector<bool>> kept(static_cast<size_t>(n), std::vector<bool>(static_cast<size_t>(k)));
  Hand h;
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < n; ++t) {
      const int64_t e = pick[static_cast<size_t>(t)][static_cast<size_t>(j)];
      kept[static_cast<size_t>(t)][static_cast<size_t>(j)] = used[static_cast<size_t>(e)]++ < capacity;
      h.dropped += kept[static_cast<size_t>(t)][static_cast<size_t>(j)] ? 0 : 1;
    }
  }
  auto experts = moe.named_children()["experts"];
  h.y = torch::zeros({n, kD});
  for (int64_t t = 0; t < n; ++t) {
    const auto& p = pick[static_cast<size_t>(t)];
    const double g0 = probs[t][p[0]].item<double>(), g1 = k == 2 ? probs[t][p[1]].item<double>() : 0.0;
    bool any = false;
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[static_cast<size_t>(t)][static_cast<size_t>(j)]) continue;
      any = true;
      const double gate = k == 1 ? g0 : (j == 0 ? g0 : g1) / (g0 + g1);
      auto expert = experts->named_children()[std::to_string(p[static_cast<size_t>(j)])]->as<ExpertImpl>();
      h.y[t] += gate * expert->forward(x[t].unsqueeze(0)).squeeze(0);
    }
    h.without += any ? 0 : 1;
  }
  double aux = 0;
  for (int64_t e = 0; e < kE; ++e) {
    int64_t first = 0;
    for (int64_t t = 0; t < n; ++t) first += pick[static_cast<size_t>(t)][0] == e;
    aux += static_cast<double>(first) / n * probs.select(1, e).mean().item<double>();
  }
  h.aux = torch::tensor(kE * aux);
  return h;
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
}

TEST(MoeLayer, EqualsALoopOverTokensAndExpertsForTop1AndTop2WithAndWithoutDrops) {
  for (int64_t k : {1, 2}) {
    for (double cf : {4.0, 0.5}) {
      auto moe = build(options(k, cf));
      const at::Tensor x = tokens(40, 3);
      const at::Tensor y = moe->forward(x);
      const Hand h = hand_moe(*moe, x);
      std::printf("top-%lld, capacity factor %.1f: output %.3g, aux %.3g from the loop; %lld dropped, %lld tokens "
                  "without an expert\n",
                  static_cast<long long>(k), cf, rel(y.detach(), h.y), rel(moe->aux_loss().detach(), h.aux),
                  static_cast<long long>(h.dropped), static_cast<long long>(h.without));
      EXPECT_LE(rel(y.detach(), h.y), 1e-5);
      EXPECT_LE(rel(moe->aux_loss().detach(), h.aux), 1e-5);
      EXPECT_EQ(moe->stats().dropped, h.dropped);
      EXPECT_EQ(moe->stats().tokens_without_expert, h.without);
      if (cf < 1) {
        EXPECT_GT(h.dropped, 0);
        // A token no expert took has a zero output: the residual carries it.
        EXPECT_GT(h.without, 0);
        int64_t zero_rows = 0;
        for (int64_t t = 0; t < x.size(0); ++t) zero_rows += y[t].abs().max().item<double>() == 0.0;
        EXPECT_EQ(zero_rows, h.without);
      } else {
        EXPECT_EQ(h.dropped, 0);
      }
    }
  }
}

// Note [Aux losses in backward]: with an aux loss weight w set and the
// thread's micro-batch loss weight f, backward of f * task gives every
// parameter the gradient of f * (task + w * aux); without a loss weight (a
// program's own loop) nothing is injected and aux_loss() is the caller's to
// add. Bitwise is not expected: the gradients meet in another order.
TEST(MoeLayer, TheAuxLossGradientComesFromInsideTheLayer) {
  const double w = 0.05, f = 0.25;
  const at::Tensor x = tokens(40, 3);
  auto added = build(options(2, 0.5));
  const at::Tensor task = added->forward(x).square().mean();  // before aux_loss(): it is the forward's
  (f * (task + w * added->aux_loss())).backward();
  auto injected = build(options(2, 0.5));
  injected->set_aux_loss_weight(w);
  {
    core::LossWeightScope weight(f);
    (f * injected->forward(x).square().mean()).backward();
  }
  const double router = rel(injected->router->weight.grad(), added->router->weight.grad());
  std::printf("router gradient, injected vs added to the loss: %.3g\n", router);
  EXPECT_LE(router, 1e-6);
  auto a = added->parameters(), b = injected->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(b[i].grad().defined(), a[i].grad().defined()) << i;  // an expert no token reached has none
    if (a[i].grad().defined()) EXPECT_LE(rel(b[i].grad(), a[i].grad()), 1e-6) << i;
  }
  // Control: without the aux term the router's gradient is another.
  auto task_only = build(options(2, 0.5));
  (f * task_only->forward(x).square().mean()).backward();
  EXPECT_GT(rel(task_only->router->weight.grad(), added->router->weight.grad()), 100 * std::max(router, 1e-9));
  // No loss weight on the thread: nothing injected, the weight set or not.
  auto no_scope = build(options(2, 0.5));
  no_scope->set_aux_loss_weight(w);
  (f * no_scope->forward(x).square().mean()).backward();
  EXPECT_TRUE(torch::equal(no_scope->router->weight.grad(), task_only->router->weight.grad()));
  // The totals: one training forward each, its aux loss summed.
  const RoutingTotals totals = injected->take_totals();
  EXPECT_EQ(totals.forwards, 1);
  EXPECT_EQ(totals.tokens, 40);
  EXPECT_DOUBLE_EQ(totals.aux_loss_sum.item<double>(), injected->aux_loss().item<double>());
  EXPECT_EQ(injected->take_totals().forwards, 0);
}

// One step's objective as the data-parallel mean: rank r's loss is
// (y_r * w_r).sum() + 0.1 aux; the reference is their mean on one process.
struct Grads {
  at::Tensor y;
  std::map<std::string, at::Tensor> grads;
};

Grads reference(int64_t k, double cf, int ranks) {
  auto moe = build(options(k, cf));
  const at::Tensor x = tokens(kTokensPerRank * ranks, 11);
  const at::Tensor w = tokens(kTokensPerRank * ranks, 12);
  const at::Tensor y = moe->forward(x);
  ((y * w).sum() / ranks + 0.1 * moe->aux_loss()).backward();
  Grads g{y.detach(), {}};
  for (const auto& p : moe->named_parameters()) g.grads[p.key()] = p.value().grad().clone();
  return g;
}

// At `ranks` ranks with the experts over `ep` of them (adjacent ranks).
double parallel_diff(int64_t k, double cf, int ranks, int ep) {
  const Grads ref = reference(k, cf, ranks);
  double worst = 0;
  std::mutex mu;
  paratrain::testing::run_ranks(ranks, [&](comm::ProcessGroup& world) {
    topology::DeviceMesh mesh(world, topology::ParallelDims{.dp = ranks / ep, .tp = ep, .pp = 1, .cp = 1});
    MoeOptions o = options(k, cf);
    o.tokens = &world;
    o.ep = &mesh.group(topology::Axis::kTp);  // the ep group: adjacent ranks
    auto moe = build(o);
    const int64_t r = world.rank();
    const at::Tensor x = tokens(kTokensPerRank * ranks, 11).narrow(0, r * kTokensPerRank, kTokensPerRank);
    const at::Tensor w = tokens(kTokensPerRank * ranks, 12).narrow(0, r * kTokensPerRank, kTokensPerRank);
    const at::Tensor y = moe->forward(x);
    if (cf < 1) EXPECT_GT(moe->stats().dropped, 0);  // the drops this case is about happened
    ((y * w).sum() + 0.1 * moe->aux_loss()).backward();
    // The data-parallel mean for the router; an expert's owner holds the
    // sum over every rank's loss: summed over its replicas, divided by R.
    double d = rel(y.detach(), ref.y.narrow(0, r * kTokensPerRank, kTokensPerRank));
    at::Tensor router = moe->router->weight.grad().clone();
    world.all_reduce(router, comm::ReduceOp::kSum)->wait();
    d = std::max(d, rel(router / ranks, ref.grads.at("router.weight")));
    comm::ProcessGroup& replicas = mesh.group(topology::Axis::kDp);
    for (const auto& p : moe->named_parameters()) {
      if (p.key().rfind("experts.", 0) != 0) continue;
      at::Tensor g = p.value().grad().clone();
      replicas.all_reduce(g, comm::ReduceOp::kSum)->wait();
      d = std::max(d, rel(g / ranks, ref.grads.at(p.key())));
    }
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
  });
  return worst;
}

TEST(MoeLayer, ExpertsOverRanksEqualOneProcessWithAndWithoutDrops) {
  struct Case {
    int64_t k;
    double cf;
    int ranks, ep;
  };
  for (const Case& c : {Case{1, 8.0, 2, 2}, Case{2, 8.0, 4, 4}, Case{2, 8.0, 4, 2}, Case{1, 0.6, 2, 2},
                        Case{2, 0.6, 4, 4}, Case{2, 0.6, 4, 2}}) {
    const double d = parallel_diff(c.k, c.cf, c.ranks, c.ep);
    std::printf("top-%lld, capacity factor %.1f, %d ranks, ep %d: outputs and gradients vs one process %.3g\n",
                static_cast<long long>(c.k), c.cf, c.ranks, c.ep, d);
    EXPECT_LE(d, 1e-5);
  }
}

// The control: each rank routing its own tokens alone (capacity counted per
// rank) drops other tokens than one process, so its outputs differ; the
// global slot count above is what makes them equal.
TEST(MoeLayer, RoutingEachRanksTokensAloneDropsOtherTokensThanOneProcess) {
  const Grads ref = reference(2, 0.6, 4);
  double worst = 0;
  int64_t dropped = 0;
  std::mutex mu;
  paratrain::testing::run_ranks(4, [&](comm::ProcessGroup& world) {
    auto moe = build(options(2, 0.6));  // no token group: this rank's tokens only
    const int64_t r = world.rank();
    const at::Tensor x = tokens(kTokensPerRank * 4, 11).narrow(0, r * kTokensPerRank, kTokensPerRank);
    const double d = rel(moe->forward(x).detach(), ref.y.narrow(0, r * kTokensPerRank, kTokensPerRank));
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
    dropped += moe->stats().dropped;
  });
  std::printf("ranks routing alone: outputs vs one process %.3g (%lld pairs dropped)\n", worst,
              static_cast<long long>(dropped));
  EXPECT_GT(worst, 1e-2);
}

// moe::ExpertParallel on a program's own model (a module holding a Moe
// built whole): at dp 4 x ep 2 each rank keeps its 2 experts, their
// gradients reduced over the replicas equal one process's, only ep group 0
// writes them, and gather() gives back the whole layer in one-process order.
TEST(MoeLayer, ExpertParallelSplitsAProgramsModelAndReducesItsExperts) {
  const Grads ref = reference(2, 8.0, 4);
  double worst = 0;
  std::mutex mu;
  paratrain::testing::run_ranks(4, [&](comm::ProcessGroup& world) {
    auto root = std::make_shared<torch::nn::Module>();
    auto moe = root->register_module("moe", build(options(2, 8.0)));  // every expert, as one process
    std::vector<std::pair<std::string, at::Tensor>> whole;
    for (const auto& item : root->named_parameters()) whole.emplace_back(item.key(), item.value().detach().clone());
    ExpertParallel experts(*root, world, /*ep=*/2, std::chrono::seconds(60));
    EXPECT_EQ(moe->local_experts(), 2);
    EXPECT_EQ(moe->first_expert(), (world.rank() % 2) * 2);
    EXPECT_EQ(experts.writes(), world.rank() < 2);
    // The whole layer back, in order, from the split ranks.
    std::vector<std::pair<std::string, at::Tensor>> local;
    for (const auto& item : root->named_parameters()) local.emplace_back(item.key(), item.value().detach());
    const auto gathered = experts.gather(local);
    ASSERT_EQ(gathered.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(gathered[i].first, whole[i].first);
      EXPECT_TRUE(gathered[i].second.equal(whole[i].second)) << whole[i].first;
    }
    const int64_t r = world.rank();
    const at::Tensor x = tokens(kTokensPerRank * 4, 11).narrow(0, r * kTokensPerRank, kTokensPerRank);
    const at::Tensor w = tokens(kTokensPerRank * 4, 12).narrow(0, r * kTokensPerRank, kTokensPerRank);
    const at::Tensor y = moe->forward(x);  // before aux_loss(): the last forward's
    ((y * w).sum() + 0.1 * moe->aux_loss()).backward();
    experts.reduce_gradients();  // what DDP would do for the router is not this test's
    double d = 0;
    int64_t checked = 0;
    for (const auto& p : moe->named_parameters()) {
      if (p.key().rfind("experts.", 0) != 0) continue;
      d = std::max(d, rel(p.value().grad(), ref.grads.at(p.key())));
      ++checked;
    }
    EXPECT_EQ(checked, 2 * 4);  // two experts, fc and proj, weight and bias
    // Each expert once in the checkpoint: written in ep group 0 only.
    std::vector<TensorSlot> slots;
    for (const auto& item : root->named_parameters()) slots.push_back({item.key(), item.value().sizes().vec(), 0, item.value(), true});
    for (const auto& slot : experts.checkpoint_slots(slots)) {
      if (slot.name.find(".experts.") != std::string::npos) EXPECT_EQ(slot.write, world.rank() < 2) << slot.name;
    }
    std::lock_guard<std::mutex> lock(mu);
    worst = std::max(worst, d);
  });
  std::printf("ExpertParallel at dp 4 x ep 2: expert gradients after reduce_gradients vs one process %.3g\n", worst);
  EXPECT_LE(worst, 1e-5);
}

TEST(MoeLayer, ExpertsAreNamedByTheirGlobalIndexOnEveryRank) {
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    MoeOptions o = options(1, 1.25);
    o.tokens = &world;
    o.ep = &world;
    auto moe = build(o);
    const std::string mine = world.rank() == 0 ? "experts.0.fc.weight" : "experts.2.fc.weight";
    EXPECT_NE(moe->named_parameters().find(mine), nullptr);
    EXPECT_EQ(moe->local_experts(), 2);
    EXPECT_EQ(moe->first_expert(), world.rank() * 2);
  });
  EXPECT_THROW(Moe(options(3, 1.0)), paratrain::Error);
  MoeOptions bad = options(1, 1.0);
  bad.experts = 3;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    MoeOptions o = bad;
    o.tokens = &world;
    o.ep = &world;
    EXPECT_THROW(Moe{o}, paratrain::Error);
  });
}

}  // namespace
}  // namespace paratrain::moe

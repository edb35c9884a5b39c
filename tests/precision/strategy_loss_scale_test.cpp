// Loss scaling through Strategy::optimizer_step (ranks as threads): an inf in
// one rank's gradient (DDP) or shard (ZeRO-2, FSDP) makes every rank skip the
// same step and halve the scale, parameters and optimizer state untouched;
// sharded unscale-then-clip equals one process clipping unscaled gradients.
// Negative controls: the rank without the inf sees finite gradients of its
// own (only the agreement tells it); clipping still-scaled gradients differs.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <limits>

#include "paratrain/optim/grad_scaler.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/precision.h"
#include "paratrain/train/strategies/strategy.h"
#include "paratrain/train/strategies/strategy_registry.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::train {
namespace {

using Params = std::vector<std::pair<std::string, at::Tensor>>;
constexpr auto kTimeout = std::chrono::seconds(60);

TrainConfig small_config(int64_t zero_stage) {
  TrainConfig c;
  c.model.kind = "mlp";
  c.model.hidden = {16, 12};
  c.data.dataset = "synthetic";
  c.data.synthetic_image_size = 5;
  c.data.synthetic_classes = 4;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.zero.stage = zero_stage;
  c.zero.unit_min_params = 100;  // several FSDP units
  return c;
}

// The global batch of step `step`: 8 rows, the same on every rank; rank r of
// n reads rows [r * 8/n, (r+1) * 8/n).
data::Batch batch_of(int step, int rank, int world) {
  // A generator of its own: ranks are threads, and two threads drawing from
  // the global one would each get part of the other's stream.
  auto gen = at::detail::createCPUGenerator(500 + step);
  data::Batch b;
  b.inputs = at::randn({8, 25}, gen);
  b.targets = at::randint(0, 4, {8}, gen, at::TensorOptions().dtype(at::kLong));
  const int64_t rows = 8 / world;
  b.inputs = b.inputs.slice(0, rank * rows, (rank + 1) * rows);
  b.targets = b.targets.slice(0, rank * rows, (rank + 1) * rows);
  return b;
}

LossFn cross_entropy() {
  return [](const at::Tensor& out, const at::Tensor& y) { return torch::nn::functional::cross_entropy(out, y); };
}

// One strategy with its model and optimizer on one rank.
struct Rig {
  std::unique_ptr<topology::DeviceMesh> mesh;
  std::unique_ptr<Strategy> strategy;
  std::unique_ptr<torch::optim::SGD> optimizer;

  Rig(const TrainConfig& c, comm::ProcessGroup& world) {
    mesh = std::make_unique<topology::DeviceMesh>(world, topology::ParallelDims::resolve(0, 1, 1, 1, world.size()));
    strategy = make_strategy(strategy_name(c), StrategyContext{c, *mesh, kTimeout});
    strategy->build_model([&c] { return paratrain::testing::seeded(3, [&c] { return make_model(c); }); });
    optimizer = std::make_unique<torch::optim::SGD>(
        strategy->optimizer_params(), torch::optim::SGDOptions(c.optimizer.lr).momentum(c.optimizer.momentum));
  }
};

bool all_finite(const std::vector<at::Tensor>& grads) {
  for (const auto& g : grads) {
    if (g.defined() && !g.isfinite().all().item<bool>()) return false;
  }
  return true;
}

void expect_equal(const Params& a, const Params& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << what << ": " << a[i].first;
  }
}

class InfSkip : public ::testing::TestWithParam<int64_t> {};

// Step 1 is clean, step 2 has an inf in rank 1's gradient (after the
// reduction: its own copy under DDP, its own shard under ZeRO/FSDP), step 3
// is clean again.
TEST_P(InfSkip, EveryRankSkipsTheSameStepAndHalvesTheScale) {
  const TrainConfig c = small_config(GetParam());
  std::vector<std::vector<bool>> stepped(2);
  std::vector<std::vector<double>> scales(2);
  std::vector<bool> rank0_grads_finite(2, false);
  testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    Rig rig(c, world);
    optim::GradScalerOptions o;
    o.init_scale = 1024;
    o.growth_interval = 1000;
    optim::GradScaler scaler(o);
    const LossFn loss = scaled_loss(cross_entropy(), &scaler);
    const int r = world.rank();
    for (int step = 0; step < 3; ++step) {
      rig.strategy->forward_backward(batch_of(step, r, 2), loss, /*sync=*/true);
      // What this rank steps: whole gradients (DDP) or its shard pieces.
      std::vector<at::Tensor> grads;
      for (const auto& p : rig.strategy->optimizer_params()) grads.push_back(p.grad());
      if (step == 1 && r == 1) {
        torch::NoGradGuard no_grad;
        for (auto& g : grads) {
          if (g.defined() && g.numel() > 0) {
            g.view({-1})[0] = std::numeric_limits<float>::infinity();
            break;
          }
        }
      }
      if (step == 1 && r == 0) rank0_grads_finite[0] = all_finite(grads);
      const Params before = rig.strategy->full_parameters();
      stepped[r].push_back(rig.strategy->optimizer_step(*rig.optimizer, 0.0, &scaler));
      scales[r].push_back(scaler.get_scale());
      const Params after = rig.strategy->full_parameters();
      if (step == 1) expect_equal(before, after, "the skipped step changed a parameter");
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(stepped[r], (std::vector<bool>{true, false, true})) << "rank " << r;
    EXPECT_EQ(scales[r], (std::vector<double>{1024, 512, 512})) << "rank " << r;
  }
  // Negative control: rank 0's own gradients were finite; it skipped only
  // because the flag was agreed over dp.
  EXPECT_TRUE(rank0_grads_finite[0]);
}

INSTANTIATE_TEST_SUITE_P(Strategies, InfSkip, ::testing::Values(0, 2, 1, 3),
                         [](const auto& info) { return "zero_stage_" + std::to_string(info.param); });

// Runs 3 steps with clipping at `clip`; `scale` > 0 scales the loss, and the
// scaler is passed to optimizer_step only when `unscale`.
Params train_clipped(int64_t zero_stage, int world_size, double clip, double scale, bool unscale) {
  const TrainConfig c = small_config(zero_stage);
  Params out;
  testing::run_ranks(world_size, [&](comm::ProcessGroup& world) {
    Rig rig(c, world);
    std::unique_ptr<optim::GradScaler> scaler;
    if (scale > 0) scaler = std::make_unique<optim::GradScaler>(optim::parse_loss_scale(std::to_string(scale)));
    const LossFn loss = scaled_loss(cross_entropy(), scaler.get());
    for (int step = 0; step < 3; ++step) {
      rig.strategy->forward_backward(batch_of(step, world.rank(), world_size), loss, true);
      // The control (unscale false): the loss is scaled but the strategy is
      // not told, so it clips the still-scaled gradients.
      EXPECT_TRUE(rig.strategy->optimizer_step(*rig.optimizer, clip, unscale ? scaler.get() : nullptr));
    }
    auto params = rig.strategy->full_parameters();
    if (world.rank() == 0) out = params;
  });
  return out;
}

double max_relative_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double ref = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / ref);
  }
  return worst;
}

// The gradient norm of this problem is ~0.3-1 per step: clip 0.05 always
// clips, clip 50 never clips the true gradients but would clip gradients
// still scaled by 1024.
TEST(UnscaleThenClip, ShardedScaledEqualsOneProcessUnscaled) {
  for (double clip : {0.05, 50.0}) {
    const Params oracle = train_clipped(0, 1, clip, 0, false);
    for (int64_t stage : {0, 2, 3}) {
      const Params scaled = train_clipped(stage, 2, clip, 1024, true);
      // A power-of-two scale is exact; what differs is the summation order
      // of the rank means and of the sharded norm: float32 ulps.
      EXPECT_LT(max_relative_diff(scaled, oracle), 1e-5) << "clip " << clip << ", zero stage " << stage;
    }
  }
  // Negative control: clipping the gradients while still scaled clips what
  // should not be clipped.
  const Params oracle = train_clipped(0, 1, 50.0, 0, false);
  const Params not_unscaled = train_clipped(2, 2, 50.0, 1024, false);
  EXPECT_GT(max_relative_diff(not_unscaled, oracle), 1e-2);
}

}  // namespace
}  // namespace paratrain::train

// GradScaler: scaled training equals unscaled training while no inf appears,
// an inf on one rank (or one shard) makes every rank in the groups skip the
// same step and back off, growth after the interval, unscale-then-clip equals
// clipping the true gradients, static/none modes, checkpoint state and config
// parsing. Negative controls: without a group the ranks disagree; clipping
// the still-scaled gradients differs from the oracle.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <limits>
#include <mutex>

#include "paratrain/core/error.h"
#include "paratrain/optim/grad_scaler.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::optim {
namespace {

using Mode = GradScalerOptions::Mode;
constexpr double kTolerance = 1e-6;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Ranks are threads sharing the global generator: build one model at a time.
torch::nn::Linear make_model(int64_t seed = 0) {
  return paratrain::testing::seeded(seed, [] { return torch::nn::Linear(6, 3); });
}

// A fixed batch per (rank, step): the loss depends on both.
at::Tensor loss_of(torch::nn::Linear& model, int rank, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 17 * rank + step);  // not the shared global one
  at::Tensor x = torch::randn({5, 6}, gen);
  at::Tensor y = torch::randn({5, 3}, gen);
  return torch::mse_loss(model->forward(x), y);
}

std::vector<at::Tensor> grads_of(torch::nn::Module& model) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model.parameters()) grads.push_back(p.grad());
  return grads;
}

at::Tensor flat_params(torch::nn::Module& model) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : model.parameters()) flat.push_back(p.detach().flatten().clone());
  return torch::cat(flat);
}

double max_relative_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

// One scaled step on this rank; `poison` puts an inf into the first gradient.
bool scaled_step(GradScaler& scaler, torch::nn::Linear& model, torch::optim::SGD& opt, int rank, int step,
                 bool poison, const std::vector<comm::ProcessGroup*>& groups) {
  opt.zero_grad();
  scaler.scale(loss_of(model, rank, step)).backward();
  if (poison) model->weight.grad().view(-1)[0] = kInf;
  scaler.unscale_(grads_of(*model), groups);
  const bool stepped = scaler.step(opt, groups);
  scaler.update();
  return stepped;
}

// Oracle: with no inf, scaled training follows plain training step by step
// (the scale is a power of two, so scaling and unscaling are exact up to the
// backward's rounding of the larger values).
TEST(GradScaler, ScaledTrainingEqualsUnscaledTraining) {
  auto plain = make_model();
  auto scaled = make_model();
  torch::optim::SGD plain_opt(plain->parameters(), 0.1);
  torch::optim::SGD scaled_opt(scaled->parameters(), 0.1);
  GradScaler scaler({.init_scale = 1024, .growth_interval = 2});
  for (int step = 0; step < 6; ++step) {
    plain_opt.zero_grad();
    loss_of(plain, 0, step).backward();
    plain_opt.step();
    EXPECT_TRUE(scaled_step(scaler, scaled, scaled_opt, 0, step, false, {}));
  }
  const double diff = max_relative_diff(flat_params(*scaled), flat_params(*plain));
  std::printf("  scaled vs plain training: max relative diff %.3g\n", diff);
  EXPECT_LE(diff, kTolerance);
  EXPECT_EQ(scaler.get_scale(), 1024 * 8);  // grew after steps 2, 4, 6
}

// The core promise: rank 1's inf makes both ranks skip the same step (the
// parameters unchanged everywhere) and halve the scale; the next clean step
// steps on both. Negative control: without the group, only rank 1 skips.
TEST(GradScaler, InfOnOneRankSkipsTheStepOnEveryRank) {
  for (bool agree : {true, false}) {
    std::mutex mu;
    std::vector<double> scales(2);
    std::vector<bool> skipped(2), changed_after_inf(2), stepped_after(2);
    testing::run_ranks(2, [&](comm::ProcessGroup& group) {
      const int rank = group.rank();
      auto model = make_model();
      torch::optim::SGD opt(model->parameters(), 0.1);
      GradScaler scaler({.init_scale = 256});
      const std::vector<comm::ProcessGroup*> groups =
          agree ? std::vector<comm::ProcessGroup*>{&group} : std::vector<comm::ProcessGroup*>{};
      const at::Tensor before = flat_params(*model);
      const bool stepped = scaled_step(scaler, model, opt, rank, 0, /*poison=*/rank == 1, groups);
      const bool changed = !torch::equal(flat_params(*model), before);
      const double scale = scaler.get_scale();
      const bool stepped2 = scaled_step(scaler, model, opt, rank, 1, false, groups);
      std::lock_guard lock(mu);
      skipped[rank] = !stepped;
      changed_after_inf[rank] = changed;
      scales[rank] = scale;
      stepped_after[rank] = stepped2;
    });
    if (agree) {
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(skipped[r]) << "rank " << r;
        EXPECT_FALSE(changed_after_inf[r]) << "rank " << r;
        EXPECT_EQ(scales[r], 128) << "rank " << r;
        EXPECT_TRUE(stepped_after[r]) << "rank " << r;
      }
    } else {
      EXPECT_FALSE(skipped[0]);
      EXPECT_TRUE(changed_after_inf[0]);
      EXPECT_EQ(scales[0], 256);
      EXPECT_TRUE(skipped[1]);
      EXPECT_EQ(scales[1], 128);
    }
  }
}

// ZeRO-2/FSDP: each rank holds one shard of the gradient; only rank 1's
// shard holds the inf. Both ranks report it, both shards are unscaled, and
// step() (unscaling by itself) skips on both. Control: no group, rank 0 misses it.
TEST(GradScaler, ShardedGradientsAgreeOnInf) {
  for (bool agree : {true, false}) {
    std::mutex mu;
    std::vector<bool> found(2), stepped(2);
    std::vector<double> unscale_err(2);
    testing::run_ranks(2, [&](comm::ProcessGroup& group) {
      const int rank = group.rank();
      const at::Tensor full = torch::arange(1, 11, torch::kFloat);  // the "full" true gradient
      at::Tensor shard_param = torch::zeros({5}, torch::requires_grad());
      at::Tensor grad = full.slice(0, 5 * rank, 5 * rank + 5).clone() * 64;
      if (rank == 1) grad[2] = kInf;  // element 7 of the full gradient
      shard_param.mutable_grad() = grad;
      torch::optim::SGD opt({shard_param}, 0.1);
      GradScaler scaler({.init_scale = 64});
      comm::ProcessGroup* g = agree ? &group : nullptr;
      const bool f = scaler.unscale_({shard_param.grad()}, g);
      const bool s = scaler.step(opt, g);  // already unscaled: no second division
      scaler.update();
      at::Tensor expect = full.slice(0, 5 * rank, 5 * rank + 5);
      at::Tensor got = shard_param.grad().clone();
      if (rank == 1) got[2] = expect[2];
      std::lock_guard lock(mu);
      found[rank] = f;
      stepped[rank] = s;
      unscale_err[rank] = max_relative_diff(got, expect);
    });
    for (int r = 0; r < 2; ++r) EXPECT_LE(unscale_err[r], kTolerance) << "rank " << r;
    EXPECT_TRUE(found[1]);
    EXPECT_FALSE(stepped[1]);
    EXPECT_EQ(found[0], agree);
    EXPECT_EQ(stepped[0], !agree);
  }
}

// Two mesh axes (dp pairs {0,1},{2,3}; tp pairs {0,2},{1,3}): an inf on rank
// 3 reaches all four ranks through dp then tp. With the dp group alone, ranks
// 0 and 1 do not hear of it (the control for composing groups).
TEST(GradScaler, ComposingDpAndTpGroupsReachesTheWholeMesh) {
  std::mutex mu;
  std::vector<bool> both(4), dp_only(4);
  testing::run_ranks(4, [&](comm::ProcessGroup& world) {
    const int rank = world.rank();
    std::shared_ptr<comm::ProcessGroup> dp, tp;
    for (const std::vector<int>& ranks : std::vector<std::vector<int>>{{0, 1}, {2, 3}, {0, 2}, {1, 3}}) {
      auto g = world.new_subgroup(ranks);
      if (!g) continue;
      (ranks[1] - ranks[0] == 1 ? dp : tp) = std::move(g);
    }
    auto run = [&](const std::vector<comm::ProcessGroup*>& groups) {
      GradScaler scaler;
      at::Tensor grad = torch::ones({3});
      if (rank == 3) grad[1] = std::numeric_limits<float>::quiet_NaN();
      return scaler.unscale_({grad}, groups);
    };
    const bool b = run({dp.get(), tp.get()});
    const bool d = run({dp.get()});
    std::lock_guard lock(mu);
    both[rank] = b;
    dp_only[rank] = d;
  });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(both[r]) << "rank " << r;
  EXPECT_FALSE(dp_only[0]);
  EXPECT_FALSE(dp_only[1]);
  EXPECT_TRUE(dp_only[2]);
  EXPECT_TRUE(dp_only[3]);
}

// Dynamic scale with interval 3: grows after 3 clean steps, halves on an inf
// and restarts the count.
TEST(GradScaler, GrowsAfterIntervalAndBacksOffOnInf) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), 0.01);
  GradScaler scaler({.init_scale = 8, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
  const std::vector<bool> poison = {false, false, false, false, true, false, false, false};
  const std::vector<double> scale_after = {8, 8, 16, 16, 8, 8, 8, 16};
  const std::vector<int64_t> tracker_after = {1, 2, 0, 1, 0, 1, 2, 0};
  for (std::size_t s = 0; s < poison.size(); ++s) {
    EXPECT_EQ(scaled_step(scaler, model, opt, 0, static_cast<int>(s), poison[s], {}), !poison[s]) << "step " << s;
    EXPECT_EQ(scaler.get_scale(), scale_after[s]) << "step " << s;
    EXPECT_EQ(scaler.growth_tracker(), tracker_after[s]) << "step " << s;
  }
}

// unscale_ then clip_grad_norm_ equals clipping the true gradients (and the
// norm returned is the true norm). Control: clipping before unscale_ differs.
TEST(GradScaler, UnscaleThenClipEqualsClippingTrueGradients) {
  constexpr double kMaxNorm = 0.05;
  auto plain = make_model();
  loss_of(plain, 0, 0).backward();
  const double plain_norm = torch::nn::utils::clip_grad_norm_(plain->parameters(), kMaxNorm);
  ASSERT_GT(plain_norm, kMaxNorm) << "clipping must be active";
  const at::Tensor oracle = torch::cat({plain->weight.grad().flatten(), plain->bias.grad().flatten()});

  for (bool unscale_first : {true, false}) {
    auto model = make_model();
    torch::optim::SGD opt(model->parameters(), 0.1);
    GradScaler scaler({.init_scale = 65536});
    scaler.scale(loss_of(model, 0, 0)).backward();
    if (unscale_first) scaler.unscale_(grads_of(*model), nullptr);
    const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), kMaxNorm);
    scaler.unscale_(grads_of(*model), nullptr);  // no-op if already unscaled
    const at::Tensor got = torch::cat({model->weight.grad().flatten(), model->bias.grad().flatten()});
    std::printf("  %s: clipped gradients vs oracle %.3g\n", unscale_first ? "unscale then clip" : "clip scaled (control)",
                max_relative_diff(got, oracle));
    if (unscale_first) {
      EXPECT_LE(max_relative_diff(got, oracle), kTolerance);
      EXPECT_NEAR(norm, plain_norm, kTolerance * plain_norm);
    } else {
      EXPECT_GT(max_relative_diff(got, oracle), 0.5);
    }
  }
}

// A repeated unscale_ in one step does not divide twice; one with other
// gradients is refused; the protocol order is enforced.
TEST(GradScaler, ProtocolChecks) {
  GradScaler scaler({.init_scale = 4});
  at::Tensor g = torch::full({2}, 8.0f);
  EXPECT_THROW(scaler.update(), c10::Error);
  EXPECT_FALSE(scaler.unscale_({g}, nullptr));
  EXPECT_FALSE(scaler.unscale_({g}, nullptr));
  EXPECT_TRUE(torch::equal(g, torch::full({2}, 2.0f)));
  EXPECT_THROW(scaler.unscale_({torch::ones({2})}, nullptr), c10::Error);
  at::Tensor p = torch::zeros({2}, torch::requires_grad());
  p.mutable_grad() = g;
  torch::optim::SGD opt({p}, 1.0);
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_THROW(scaler.step(opt), c10::Error);
  EXPECT_THROW(scaler.unscale_({g}, nullptr), c10::Error);
  scaler.update();
  EXPECT_TRUE(torch::equal(p.detach(), torch::full({2}, -2.0f)));
}

// Half-precision gradients (bf16 runs on CPU) are unscaled in place, keep
// their dtype, and their inf is found.
TEST(GradScaler, UnscalesHalfPrecisionGradients) {
  GradScaler scaler({.init_scale = 128});
  at::Tensor clean = torch::tensor({128.0f, -384.0f}).to(torch::kBFloat16);
  at::Tensor dirty = torch::tensor({256.0f, kInf}).to(torch::kBFloat16);
  EXPECT_TRUE(scaler.unscale_({clean, dirty}, nullptr));
  EXPECT_EQ(clean.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(clean.to(torch::kFloat), torch::tensor({1.0f, -3.0f})));
  EXPECT_EQ(dirty[0].item<float>(), 2.0f);
}

// Static: the scale never moves, but inf steps are still skipped.
TEST(GradScaler, StaticModeKeepsScaleAndSkipsInf) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), 0.1);
  GradScaler scaler(parse_loss_scale("1024", {.growth_interval = 1}));
  EXPECT_EQ(scaler.options().mode, Mode::kStatic);
  EXPECT_TRUE(scaled_step(scaler, model, opt, 0, 0, false, {}));
  EXPECT_EQ(scaler.get_scale(), 1024);
  const at::Tensor before = flat_params(*model);
  EXPECT_FALSE(scaled_step(scaler, model, opt, 0, 1, true, {}));
  EXPECT_TRUE(torch::equal(flat_params(*model), before));
  EXPECT_EQ(scaler.get_scale(), 1024);
}

// None: a pass-through. The loss is not scaled, gradients are not touched or
// checked, and the optimizer always steps (an inf reaches the parameters, as
// without a scaler).
TEST(GradScaler, NoneModeIsAPassThrough) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), 0.1);
  GradScaler scaler(parse_loss_scale("none"));
  EXPECT_EQ(scaler.get_scale(), 1);
  const at::Tensor loss = loss_of(model, 0, 0);
  EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
  EXPECT_TRUE(scaled_step(scaler, model, opt, 0, 0, true, {}));
  EXPECT_FALSE(torch::isfinite(model->weight).all().item<bool>());
  EXPECT_EQ(scaler.get_scale(), 1);
}

// state() -> load_state() restores scale and tracker: the restored scaler
// grows on the same step as the original. Bad entries are CheckpointErrors.
TEST(GradScaler, StateRoundTrip) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), 0.01);
  GradScaler a({.init_scale = 32, .growth_interval = 3});
  scaled_step(a, model, opt, 0, 0, true, {});
  scaled_step(a, model, opt, 0, 1, false, {});
  scaled_step(a, model, opt, 0, 2, false, {});
  GradScaler b({.init_scale = 32, .growth_interval = 3});
  b.load_state(a.state());
  EXPECT_EQ(b.get_scale(), 16);
  EXPECT_EQ(b.growth_tracker(), 2);
  scaled_step(a, model, opt, 0, 3, false, {});
  scaled_step(b, model, opt, 0, 3, false, {});
  EXPECT_EQ(a.get_scale(), 32);
  EXPECT_EQ(b.get_scale(), 32);

  auto state = a.state();
  EXPECT_THROW(b.load_state({state[0]}), CheckpointError);
  state[0].second = torch::ones({1}, torch::kFloat);
  EXPECT_THROW(b.load_state(state), CheckpointError);
  state[0].second = torch::full({1}, -1.0, torch::kDouble);
  EXPECT_THROW(b.load_state(state), CheckpointError);
}

TEST(GradScaler, ParseLossScale) {
  EXPECT_EQ(parse_loss_scale("dynamic").mode, Mode::kDynamic);
  EXPECT_EQ(parse_loss_scale("none").mode, Mode::kNone);
  const GradScalerOptions s = parse_loss_scale("128.5", {.growth_interval = 7});
  EXPECT_EQ(s.mode, Mode::kStatic);
  EXPECT_EQ(s.init_scale, 128.5);
  EXPECT_EQ(s.growth_interval, 7);
  for (const char* bad : {"", "Dynamic", "abc", "0", "-4", "inf", "nan", "12x", " 3"}) {
    try {
      parse_loss_scale(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("precision.loss_scale"), std::string::npos) << what;
      EXPECT_NE(what.find("\"dynamic\""), std::string::npos) << what;
      EXPECT_NE(what.find("\"none\""), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace paratrain::optim

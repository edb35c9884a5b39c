// LrSchedule: the rate at chosen steps (0, mid-warmup, end of warmup,
// mid-cosine, last step, step-decay boundaries) equals the formulas written
// out here by hand; parse/validate errors name the config key; and
// set_learning_rate reaches every param group of every optimizer kind.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include "paratrain/core/error.h"
#include "paratrain/optim/lamb.h"
#include "paratrain/optim/lars.h"
#include "paratrain/optim/lr_schedule.h"
#include "tests/data/expect_error.h"

namespace paratrain::optim {
namespace {

using data::testing::expect_error;
using Scaling = LrScheduleOptions::Scaling;
using Decay = LrScheduleOptions::Decay;

// Base 0.1 tuned at batch 256, run at 4096 (k = 16): peak 1.6 (linear) or 0.4 (sqrt).
LrScheduleOptions scaled(Scaling scaling, Decay decay) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.base_batch = 256;
  o.global_batch = 4096;
  o.scaling = scaling;
  o.warmup_steps = 10;
  o.decay = decay;
  o.total_steps = 110;
  o.min_lr = 0.01;
  o.step_size = 30;
  o.gamma = 0.5;
  return o;
}

TEST(LrScheduleTest, LinearScalingWarmupFromZeroThenCosine) {
  const LrSchedule s(scaled(Scaling::kLinear, Decay::kCosine));
  const double peak = 0.1 * 4096.0 / 256.0;
  EXPECT_DOUBLE_EQ(s.peak_lr(), 1.6);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);           // warmup starts at peak * 0
  EXPECT_DOUBLE_EQ(s.lr(5), peak * 5 / 10);  // mid-warmup
  EXPECT_DOUBLE_EQ(s.lr(9), peak * 9 / 10);
  EXPECT_DOUBLE_EQ(s.lr(10), peak);  // end of warmup: cosine at progress 0
  // Mid-cosine: progress (60 - 10) / 100 = 0.5, cos = 0, halfway to the floor.
  EXPECT_NEAR(s.lr(60), 0.01 + (peak - 0.01) * 0.5, 1e-12);
  // Last step 109: progress 99/100.
  EXPECT_NEAR(s.lr(109), 0.01 + (peak - 0.01) * 0.5 * (1 + std::cos(std::numbers::pi * 0.99)), 1e-12);
  EXPECT_DOUBLE_EQ(s.lr(110), 0.01);
  EXPECT_DOUBLE_EQ(s.lr(1000), 0.01);
}

TEST(LrScheduleTest, SqrtScalingWithStartFactorThenStepDecay) {
  LrScheduleOptions o = scaled(Scaling::kSqrt, Decay::kStep);
  o.warmup_start_factor = 0.25;  // Goyal et al.'s gradual warmup from base_lr is f = 1/k
  const LrSchedule s(o);
  const double peak = 0.1 * std::sqrt(16.0);
  EXPECT_DOUBLE_EQ(s.peak_lr(), peak);
  EXPECT_DOUBLE_EQ(s.lr(0), peak * 0.25);
  EXPECT_DOUBLE_EQ(s.lr(4), peak * (0.25 + 0.75 * 4 / 10));
  EXPECT_DOUBLE_EQ(s.lr(10), peak);
  // Step decay counts from step 0: boundaries at 30, 60, 90.
  EXPECT_DOUBLE_EQ(s.lr(29), peak);
  EXPECT_DOUBLE_EQ(s.lr(30), peak * 0.5);
  EXPECT_DOUBLE_EQ(s.lr(59), peak * 0.5);
  EXPECT_DOUBLE_EQ(s.lr(60), peak * 0.25);
  EXPECT_DOUBLE_EQ(s.lr(90), peak * 0.125);
}

TEST(LrScheduleTest, NoScalingNoWarmupConstant) {
  LrScheduleOptions o;
  o.base_lr = 0.05;
  const LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.05);
  EXPECT_DOUBLE_EQ(s.lr(12345), 0.05);
  EXPECT_NE(s.describe().find("0.05"), std::string::npos) << s.describe();
}

TEST(LrScheduleTest, DescribeNamesTheDerivedValues) {
  const std::string line = LrSchedule(scaled(Scaling::kLinear, Decay::kCosine)).describe();
  for (const char* part : {"base 0.1", "batch 256", "linear", "x16", "peak 1.6", "4096", "warmup 10", "cosine",
                           "0.01", "110"})
    EXPECT_NE(line.find(part), std::string::npos) << "lacks '" << part << "': " << line;
}

TEST(LrScheduleTest, ParseAcceptsTheDocumentedNames) {
  EXPECT_EQ(parse_lr_scaling("none"), Scaling::kNone);
  EXPECT_EQ(parse_lr_scaling("linear"), Scaling::kLinear);
  EXPECT_EQ(parse_lr_scaling("sqrt"), Scaling::kSqrt);
  EXPECT_EQ(parse_lr_decay("constant"), Decay::kConstant);
  EXPECT_EQ(parse_lr_decay("cosine"), Decay::kCosine);
  EXPECT_EQ(parse_lr_decay("step"), Decay::kStep);
  for (Scaling s : {Scaling::kNone, Scaling::kLinear, Scaling::kSqrt}) EXPECT_EQ(parse_lr_scaling(to_string(s)), s);
  for (Decay d : {Decay::kConstant, Decay::kCosine, Decay::kStep}) EXPECT_EQ(parse_lr_decay(to_string(d)), d);
}

TEST(LrScheduleTest, ParseErrorsNameKeyAndAllowedValues) {
  expect_error<ConfigError>([] { parse_lr_scaling("Linear"); }, {"lr.scaling", "\"Linear\"", "none", "linear", "sqrt"});
  expect_error<ConfigError>([] { parse_lr_decay("exp"); }, {"lr.decay", "\"exp\"", "constant", "cosine", "step"});
}

TEST(LrScheduleTest, ValidateNamesTheOffendingKey) {
  auto fails = [](auto mutate, std::vector<std::string> fragments) {
    LrScheduleOptions o = scaled(Scaling::kLinear, Decay::kCosine);
    mutate(o);
    expect_error<ConfigError>([&] { LrSchedule s(o); }, fragments);
  };
  fails([](auto& o) { o.base_batch = 0; }, {"lr.base_batch", "linear"});
  fails([](auto& o) { o.base_batch = -1; }, {"lr.base_batch"});
  fails([](auto& o) { o.global_batch = 0; }, {"lr.global_batch"});
  fails([](auto& o) { o.base_lr = -0.1; }, {"lr.base_lr"});
  fails([](auto& o) { o.warmup_steps = -1; }, {"lr.warmup_steps"});
  fails([](auto& o) { o.warmup_start_factor = 1.5; }, {"lr.warmup_start_factor"});
  fails([](auto& o) { o.total_steps = 10; }, {"lr.total_steps", "lr.warmup_steps"});
  fails([](auto& o) { o.min_lr = 5.0; }, {"lr.min_lr", "peak"});
  fails([](auto& o) { o.decay = Decay::kStep; o.step_size = 0; }, {"lr.step_size"});
  fails([](auto& o) { o.decay = Decay::kStep; o.gamma = 0; }, {"lr.gamma"});
  // Fields of a decay that is not selected are not checked.
  LrScheduleOptions o = scaled(Scaling::kLinear, Decay::kConstant);
  o.step_size = 0;
  o.total_steps = 0;
  EXPECT_NO_THROW(LrSchedule{o});
}

TEST(LrScheduleTest, SetLearningRateReachesEveryGroupOfEveryKind) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({3}, torch::requires_grad());
  auto check = [&](torch::optim::Optimizer& opt) {
    set_learning_rate(opt, 0.125);
    ASSERT_EQ(opt.param_groups().size(), 2u);
    for (const auto& g : opt.param_groups()) EXPECT_DOUBLE_EQ(g.options().get_lr(), 0.125);
  };
  auto groups = [&] {
    return std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup({a}),
                                                          torch::optim::OptimizerParamGroup({b})};
  };
  torch::optim::SGD sgd(groups(), torch::optim::SGDOptions(1.0));
  torch::optim::Adam adam(groups(), torch::optim::AdamOptions(1.0));
  torch::optim::AdamW adamw(groups(), torch::optim::AdamWOptions(1.0));
  Lars lars(lars_param_groups(split_for_adaptation(std::vector<at::Tensor>{a, b}, {2, 1}), LarsOptions(1.0)),
            LarsOptions(1.0));
  Lamb lamb(lamb_param_groups(split_for_adaptation(std::vector<at::Tensor>{a, b}, {2, 1}), LambOptions(1.0)),
            LambOptions(1.0));
  check(sgd);
  check(adam);
  check(adamw);
  check(lars);
  check(lamb);
}

}  // namespace
}  // namespace paratrain::optim

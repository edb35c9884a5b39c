// Tests of training checkpoints: resuming from a checkpoint gives exactly the
// parameters of an uninterrupted run (SGD with momentum, Adam, AdamW with
// amsgrad; a model with buffers; RNG-dependent steps), mismatches are refused
// with the tensor named, and the run-folder helpers pick the right file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "paratrain/core/error.h"
#include "paratrain/models/mlp.h"
#include "paratrain/checkpoint/checkpoint.h"
#include "paratrain/checkpoint/safetensors.h"
#include "tests/support/multi_rank.h"

namespace ck = paratrain::checkpoint;
namespace pm = paratrain::models;
namespace fs = std::filesystem;
using paratrain::CheckpointError;

namespace {

// A fresh folder per test, removed when the test binary exits.
struct TempDir {
  fs::path path = paratrain::testing::temp_dir("paratrain_ckpt");
};

// A model with buffers (BatchNorm running stats and a step counter).
struct NormNet : torch::nn::Module {
  torch::nn::Linear fc0{nullptr}, fc1{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  NormNet() {
    fc0 = register_module("fc0", torch::nn::Linear(12, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc1 = register_module("fc1", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return fc1(torch::relu(bn(fc0(x)))); }
};

ck::TrainingState at_step(int64_t step) {
  ck::TrainingState s;
  s.step = step;
  return s;
}

using Forward = std::function<at::Tensor(const at::Tensor&)>;

// Step i uses a fixed batch, plus input noise drawn from the default
// generator so that resuming also depends on the restored RNG state.
void train_steps(const Forward& forward, torch::optim::Optimizer& opt, int first, int count) {
  for (int i = first; i < first + count; ++i) {
    auto gen = at::detail::createCPUGenerator(1000 + i);
    auto x = at::randn({8, 12}, gen);
    auto y = at::randint(0, 4, {8}, gen);
    x = x + 0.1 * torch::randn({8, 12});
    opt.zero_grad();
    torch::nn::functional::cross_entropy(forward(x), y).backward();
    opt.step();
  }
}

std::vector<at::Tensor> state_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

bool identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// Runs 3 steps, saves, runs 3 more (the uninterrupted reference); then builds
// fresh objects from another seed, loads with `load`, runs the same 3 steps.
// Returns {reference, resumed}.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> resume_experiment(
    const MakeOptimizer& make_opt, const std::function<void(const fs::path&, NormNet&, torch::optim::Optimizer&)>& load) {
  TempDir dir;
  const fs::path file = dir.path / "ckpt.safetensors";
  torch::manual_seed(11);
  auto a = std::make_shared<NormNet>();
  auto opt_a = make_opt(a->parameters());
  train_steps([&](const at::Tensor& x) { return a->forward(x); }, *opt_a, 0, 3);
  ck::save_checkpoint(file, *a, *opt_a, at_step(3));
  train_steps([&](const at::Tensor& x) { return a->forward(x); }, *opt_a, 3, 3);

  torch::manual_seed(99);  // different init and RNG position: all must come from the file
  auto b = std::make_shared<NormNet>();
  auto opt_b = make_opt(b->parameters());
  load(file, *b, *opt_b);
  train_steps([&](const at::Tensor& x) { return b->forward(x); }, *opt_b, 3, 3);
  return {state_of(*a), state_of(*b)};
}

void full_load(const fs::path& f, NormNet& m, torch::optim::Optimizer& o) { ck::load_checkpoint(f, m, o); }
// Control: everything but the optimizer state.
void drop_optimizer_state(const fs::path& f, NormNet& m, torch::optim::Optimizer& o) {
  ck::load_checkpoint(f, m, o);
  o.state().clear();
}

}  // namespace

TEST(Checkpoint, ResumingSgdWithMomentumMatchesTheUninterruptedRun) {
  MakeOptimizer sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  };
  auto [reference, resumed] = resume_experiment(sgd, full_load);
  EXPECT_TRUE(identical(reference, resumed));

  // Controls: without the optimizer state, or without the RNG state, the
  // runs differ, so the check above really depends on both.
  auto [r1, no_optimizer_state] = resume_experiment(sgd, drop_optimizer_state);
  EXPECT_FALSE(identical(r1, no_optimizer_state));
  auto [r2, no_rng] = resume_experiment(sgd, [](const fs::path& f, NormNet& m, torch::optim::Optimizer& o) {
    ck::load_checkpoint(f, m, o, {.restore_rng = false});
  });
  EXPECT_FALSE(identical(r2, no_rng));
}

TEST(Checkpoint, ResumingAdamAndAdamWMatchesTheUninterruptedRun) {
  MakeOptimizer adam = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2));
  };
  auto [ra, sa] = resume_experiment(adam, full_load);
  EXPECT_TRUE(identical(ra, sa));
  MakeOptimizer adamw = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  };
  auto [rw, sw] = resume_experiment(adamw, full_load);
  EXPECT_TRUE(identical(rw, sw));
  auto [rc, control] = resume_experiment(adam, drop_optimizer_state);
  EXPECT_FALSE(identical(rc, control));
}

TEST(Checkpoint, FileHoldsNamedTensorsAndTheTrainingState) {
  TempDir dir;
  const fs::path file = dir.path / "c.safetensors";
  torch::manual_seed(0);
  auto model = pm::make_mlp({.in_features = 12, .hidden = {16}, .out_features = 4});
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  train_steps([&](const at::Tensor& x) { return model->forward(x); }, opt, 0, 2);
  ck::TrainingState state{.step = 1234, .epoch = 2, .batch_in_epoch = 17, .sampler_seed = 42,
                          .config = {{"optimizer", {{"lr", 0.001}}}}, .extra = {{"world_size", "2"}}};
  ck::save_checkpoint(file, *model, opt, state);
  const auto rng_after_save = torch::rand({4});

  const auto c = ck::read_safetensors(file);
  for (const char* name : {"model/fc0.weight", "model/fc0.bias", "model/fc1.weight", "model/fc1.bias",
                           "optimizer/fc0.weight/exp_avg", "optimizer/fc0.weight/exp_avg_sq",
                           "optimizer/fc1.bias/step", "rng/cpu"})
    EXPECT_TRUE(c.tensors.count(name)) << name;
  EXPECT_EQ(c.tensors.at("optimizer/fc1.bias/step").item<int64_t>(), 2);
  EXPECT_EQ(c.tensors.at("rng/cpu").scalar_type(), torch::kByte);
  EXPECT_EQ(c.metadata.at("optimizer"), "adam");
  EXPECT_TRUE(torch::equal(c.tensors.at("model/fc1.weight"), model->named_parameters()["fc1.weight"]));

  torch::optim::Adam opt2(model->parameters(), torch::optim::AdamOptions(1e-3));
  const auto loaded = ck::load_checkpoint(file, *model, opt2);
  EXPECT_EQ(torch::rand({4}).equal(rng_after_save), true) << "RNG restored to its state at save time";
  EXPECT_EQ(loaded.step, 1234);
  EXPECT_EQ(loaded.epoch, 2);
  EXPECT_EQ(loaded.batch_in_epoch, 17);
  EXPECT_EQ(loaded.sampler_seed, 42u);
  EXPECT_EQ(loaded.config, state.config);
  EXPECT_EQ(loaded.extra, state.extra);
}

TEST(Checkpoint, MismatchesAreRefusedAndLeaveTheModelUntouched) {
  TempDir dir;
  const fs::path file = dir.path / "c.safetensors";
  torch::manual_seed(0);
  auto small = pm::make_mlp({.in_features = 12, .hidden = {16}, .out_features = 4});
  torch::optim::SGD sgd(small->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_steps([&](const at::Tensor& x) { return small->forward(x); }, sgd, 0, 1);
  ck::save_checkpoint(file, *small, sgd, {});

  auto expect_error = [](const std::function<void()>& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected CheckpointError containing " << needle;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto wider = pm::make_mlp({.in_features = 12, .hidden = {32}, .out_features = 4});
  const auto before = state_of(*wider);
  torch::optim::SGD sgd_wider(wider->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  expect_error([&] { ck::load_checkpoint(file, *wider, sgd_wider); },
               "tensor 'model/fc0.weight' is Float [16, 12] in the file but Float [32, 12] in the model");
  EXPECT_TRUE(identical(before, state_of(*wider)));

  auto deeper = pm::make_mlp({.in_features = 12, .hidden = {16, 16}, .out_features = 4});
  torch::optim::SGD sgd_deeper(deeper->parameters(), torch::optim::SGDOptions(0.1));
  expect_error([&] { ck::load_checkpoint(file, *deeper, sgd_deeper); }, "has no tensor 'model/fc2.weight'");
  auto linear = pm::make_mlp({.in_features = 12, .hidden = {}, .out_features = 4});
  expect_error([&] { ck::load_model_weights(file, *linear); }, "tensor 'model/fc1.bias' that the model lacks");

  auto same = pm::make_mlp({.in_features = 12, .hidden = {16}, .out_features = 4});
  torch::optim::Adam adam(same->parameters(), torch::optim::AdamOptions(1e-3));
  expect_error([&] { ck::load_checkpoint(file, *same, adam); },
               "holds sgd optimizer state but the optimizer is adam");
  torch::optim::RMSprop rms(same->parameters(), torch::optim::RMSpropOptions(1e-3));
  expect_error([&] { ck::save_checkpoint(dir.path / "r.safetensors", *same, rms, {}); }, "supported: SGD, Adam, AdamW");
  auto other = pm::make_mlp({.in_features = 12, .hidden = {16}, .out_features = 4});
  torch::optim::SGD foreign(other->parameters(), torch::optim::SGDOptions(0.1));
  expect_error([&] { ck::save_checkpoint(dir.path / "f.safetensors", *same, foreign, {}); },
               "not in the model");

  // A plain safetensors file is not a checkpoint.
  ck::write_safetensors(dir.path / "plain.safetensors", {{{"model/fc0.weight", torch::zeros({16, 12})}}, {}});
  expect_error([&] { ck::load_model_weights(dir.path / "plain.safetensors", *same); }, "not a paratrain checkpoint");
}

TEST(Checkpoint, LatestCheckpointSkipsTempFilesAndCorruptOnes) {
  TempDir dir;
  EXPECT_FALSE(ck::find_latest_checkpoint(dir.path).has_value());
  torch::manual_seed(0);
  auto model = pm::make_mlp({.in_features = 4, .hidden = {}, .out_features = 2});
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  fs::create_directories(dir.path / "checkpoints");
  for (int64_t step : {5, 100, 12}) ck::save_checkpoint(ck::checkpoint_path(dir.path, step), *model, sgd, at_step(step));
  EXPECT_EQ(ck::checkpoint_path(dir.path, 12).filename(), "step_00000012.safetensors");
  // A crashed writer's leftover and a damaged newer file must not be chosen.
  std::ofstream(ck::checkpoint_path(dir.path, 300).string() + ".tmp.4242") << "partial";
  std::ofstream(ck::checkpoint_path(dir.path, 200)) << "garbage that is not a checkpoint";
  const auto latest = ck::find_latest_checkpoint(dir.path);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, ck::checkpoint_path(dir.path, 100));
  EXPECT_EQ(ck::load_model_weights(*latest, *model).step, 100);

  EXPECT_EQ(ck::prune_checkpoints(dir.path, 2), 2);  // keeps 200 and 100, drops 12 and 5
  EXPECT_TRUE(fs::exists(ck::checkpoint_path(dir.path, 100)));
  EXPECT_FALSE(fs::exists(ck::checkpoint_path(dir.path, 12)));
  EXPECT_FALSE(fs::exists(ck::checkpoint_path(dir.path, 5)));
}

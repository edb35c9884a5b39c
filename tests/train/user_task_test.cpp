// A program's own model and loss through the Trainer (TrainerParts,
// train/user_module.h, train/task.h): plain torch::nn::Modules with no
// paratrain base class, trained with their own Task at 2 ranks under DDP,
// ZeRO-2 and ZeRO-3, each equal to one process on the global batch (rtol
// 1e-5 after 20 SGD steps); a checkpoint of the 2-rank run resumed on 1 rank
// equals the uninterrupted run; the task's own metrics reach metrics.jsonl
// and train.monitor. Negative controls: the two-output model trained
// without its classification term, and one step less, are told apart.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/task.h"
#include "paratrain/train/trainer.h"
#include "paratrain/train/user_module.h"
#include "tests/support/multi_rank.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::train {
namespace {

using paratrain::testing::one_process;
using paratrain::testing::Params;
using paratrain::testing::relative_diff;
namespace F = torch::nn::functional;

// A regression net as a LibTorch user writes it: no paratrain base class.
struct RegressorImpl : torch::nn::Module {
  explicit RegressorImpl(int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(4, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 1))) {}
  at::Tensor forward(at::Tensor x) { return fc2(torch::tanh(fc1(x))).squeeze(1); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Regressor);

// Two heads (a value and 3 classes) side by side: [N, 1 + 3].
struct TwoHeadsImpl : torch::nn::Module {
  explicit TwoHeadsImpl(int64_t hidden)
      : trunk(register_module("trunk", torch::nn::Linear(4, hidden))),
        value(register_module("value", torch::nn::Linear(hidden, 1))),
        classes(register_module("classes", torch::nn::Linear(hidden, 3))) {}
  at::Tensor forward(at::Tensor x) {
    auto h = torch::relu(trunk(x));
    return torch::cat({value(h), classes(h)}, 1);
  }
  torch::nn::Linear trunk, value, classes;
};

class MseTask : public Task {
 public:
  at::Tensor loss(const at::Tensor& out, const at::Tensor& y) const override { return F::mse_loss(out, y); }
  EvalSums eval_sums(const at::Tensor& out, const at::Tensor& y) const override {
    EvalSums s;
    s.count = static_cast<double>(y.size(0));
    s.add("loss", (out - y).pow(2).sum().item<double>());
    s.add("mae", (out - y).abs().sum().item<double>());
    return s;
  }
  std::string name() const override { return "mse"; }
};

// Targets [N, 2]: the value, then the class id (as a float).
class TwoHeadsTask : public Task {
 public:
  explicit TwoHeadsTask(double class_weight) : w_(class_weight) {}
  at::Tensor loss(const at::Tensor& out, const at::Tensor& y) const override {
    auto l = F::mse_loss(out.select(1, 0), y.select(1, 0));
    if (w_ == 0) return l;
    return l + w_ * F::cross_entropy(out.slice(1, 1), y.select(1, 1).to(torch::kLong));
  }
  EvalSums eval_sums(const at::Tensor& out, const at::Tensor& y) const override {
    EvalSums s;
    s.count = static_cast<double>(y.size(0));
    const auto labels = y.select(1, 1).to(torch::kLong);
    const auto mse = (out.select(1, 0) - y.select(1, 0)).pow(2);
    const auto ce = F::cross_entropy(out.slice(1, 1), labels, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    s.add("loss", (mse + w_ * ce).sum().item<double>());
    s.add("accuracy", out.slice(1, 1).argmax(1).eq(labels).sum().item<double>());
    s.add("value_mse", mse.sum().item<double>());
    return s;
  }

 private:
  double w_;
};

data::TensorDataset regression_rows(int64_t n, uint64_t seed, bool two_heads) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, 4}, gen);
  auto value = torch::sin(x.select(1, 0)) + 0.5 * x.select(1, 1) * x.select(1, 2);
  if (!two_heads) return {x, value};
  auto label = (x.slice(1, 1, 4)).argmax(1).to(torch::kFloat);
  return {x, torch::stack({value, label}, 1)};
}

TrainerParts regression_parts() {
  TrainerParts p;
  p.model = any_module([](const TrainConfig& c) { return Regressor(c.user.get<int64_t>("hidden")); });
  p.task = std::make_shared<MseTask>();
  p.data = [](const TrainConfig& c) {
    return Datasets{regression_rows(640, c.run.seed + 1, false), regression_rows(128, c.run.seed + 2, false)};
  };
  return p;
}

TrainerParts two_heads_parts(double class_weight = 0.5) {
  TrainerParts p;
  p.model = any_module([](const TrainConfig& c) { return std::make_shared<TwoHeadsImpl>(c.user.get<int64_t>("hidden")); });
  p.task = std::make_shared<TwoHeadsTask>(class_weight);
  p.data = [](const TrainConfig& c) {
    return Datasets{regression_rows(640, c.run.seed + 1, true), regression_rows(128, c.run.seed + 2, true)};
  };
  return p;
}

// 20 SGD steps (momentum 0.9), global batch 32, [user] hidden = 16.
TrainConfig user_config(const std::string& dir, const std::string& name, int64_t zero_stage) {
  TrainConfig c = config_from_toml_string("[user]\nhidden = 16\n");
  c.run.name = name;
  c.run.output_dir = dir;
  c.run.seed = 7;
  c.run.log_every = 10;
  c.data.global_batch_size = 32;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.train.epochs = 1;
  c.train.max_steps = 20;
  c.train.eval_every_epochs = 0;
  c.zero.stage = zero_stage;
  return c;
}

// The strategy the last multi-rank run used ("ddp (bucketed)", "zero (stage 2)", ...).
std::string last_strategy;

Params train_parts(const TrainConfig& c, comm::ProcessGroup& g, TrainerParts parts) {
  Trainer t(c, g, std::move(parts));
  t.fit();
  if (g.rank() == 0) last_strategy = t.strategy_name();
  return t.full_parameters();
}

Params one_rank(const TrainConfig& c, TrainerParts parts) {
  Params out;
  paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& g) { out = train_parts(c, g, parts); });
  return out;
}

// Rank 0's parameters after training `c` on `n` thread-ranks.
Params n_ranks(int n, const TrainConfig& c, const TrainerParts& parts) {
  Params out;
  paratrain::testing::run_ranks(n, [&](comm::ProcessGroup& g) {
    auto p = train_parts(c, g, parts);
    if (g.rank() == 0) out = std::move(p);
  });
  return out;
}

Params two_ranks(const TrainConfig& c, const TrainerParts& parts) { return n_ranks(2, c, parts); }

std::vector<std::string> names(const Params& p) {
  std::vector<std::string> out;
  for (const auto& [n, t] : p) out.push_back(n);
  return out;
}

TEST(UserTask, RegressionAtTwoRanksEqualsOneProcessUnderDdpZero2AndZero3) {
  const std::string dir = paratrain::testing::temp_dir("user-task");
  const Params reference = one_rank(user_config(dir, "one", 0), regression_parts());
  // The module's own names, as its named_parameters() gives them.
  EXPECT_EQ(names(reference), (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  for (int64_t stage : {0, 2, 3}) {
    const Params two = two_ranks(user_config(dir, "two_z" + std::to_string(stage), stage), regression_parts());
    ASSERT_EQ(names(two), names(reference));
    // The stage really ran (with 2 ranks every reduction sums two halves,
    // a + b in any order: the stages agree bitwise with each other).
    EXPECT_NE(last_strategy.find(stage == 0 ? "ddp" : stage == 3 ? "fsdp" : "zero"), std::string::npos)
        << last_strategy;
    const double diff = relative_diff(two, reference);
    std::printf("regression, zero.stage %lld: 2 ranks vs one process after 20 steps: %.3g (tolerance 1e-5)\n",
                static_cast<long long>(stage), diff);
    EXPECT_LE(diff, 1e-5) << "zero.stage " << stage;
    // It trained: the weights moved from the initial ones by far more.
    TrainConfig none = user_config(dir, "none_z" + std::to_string(stage), stage);
    none.train.max_steps = 19;
    EXPECT_GT(relative_diff(one_rank(none, regression_parts()), reference), 100 * std::max(diff, 1e-7))
        << "one step less is not told apart";
  }
}

TEST(UserTask, TwoHeadsWithACustomLossEqualOneProcessAndTheLossMatters) {
  const std::string dir = paratrain::testing::temp_dir("user-task");
  const Params reference = one_rank(user_config(dir, "one", 0), two_heads_parts());
  for (int64_t stage : {0, 2, 3}) {
    const Params two = two_ranks(user_config(dir, "two_z" + std::to_string(stage), stage), two_heads_parts());
    const double diff = relative_diff(two, reference);
    std::printf("two heads, zero.stage %lld: 2 ranks vs one process after 20 steps: %.3g (tolerance 1e-5)\n",
                static_cast<long long>(stage), diff);
    EXPECT_LE(diff, 1e-5) << "zero.stage " << stage;
  }
  // Negative control: without the classification term the trunk trains
  // otherwise (the class head gets no gradient at all).
  const Params value_only = two_ranks(user_config(dir, "value_only", 2), two_heads_parts(0.0));
  EXPECT_GT(relative_diff(value_only, reference), 1e-3);
}

TEST(UserTask, ACheckpointOfTwoRanksResumesOnOneAndEqualsTheUninterruptedRun) {
  const std::string dir = paratrain::testing::temp_dir("user-task");
  const Params reference = one_rank(user_config(dir, "one", 0), two_heads_parts());
  TrainConfig first = user_config(dir, "first", 3);
  first.train.max_steps = 10;
  first.train.checkpoint_every_steps = 10;
  two_ranks(first, two_heads_parts());
  TrainConfig rest = user_config(dir, "rest", 0);
  rest.train.resume = (std::filesystem::path(dir) / "first" / "version_0" / "checkpoints" / "step_00000010").string();
  const Params resumed = one_rank(rest, two_heads_parts());
  const double diff = relative_diff(resumed, reference);
  std::printf("resumed on 1 rank from 2 ranks' step 10 vs uninterrupted: %.3g (tolerance 1e-5)\n", diff);
  EXPECT_LE(diff, 1e-5);
}

TEST(UserTask, TheTasksMetricsAreLoggedAndMonitored) {
  const std::string dir = paratrain::testing::temp_dir("user-task");
  TrainConfig c = user_config(dir, "metrics", 0);
  c.train.max_steps = 0;
  c.train.epochs = 2;
  c.train.eval_every_epochs = 1;
  c.train.monitor = "test_value_mse";
  std::filesystem::path run;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    Trainer t(c, g, two_heads_parts());
    const TrainResult r = t.fit();
    if (g.rank() != 0) return;
    run = r.run_dir;
    EXPECT_EQ(r.test.count, 128);
    bool saw = false;
    for (const auto& [name, v] : r.test.metrics) saw = saw || name == "test_value_mse";
    EXPECT_TRUE(saw);
  });
  std::ifstream in(run / "metrics.jsonl");
  int evals = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") != "eval") continue;
    ++evals;
    EXPECT_TRUE(j.contains("test_value_mse")) << line;
    EXPECT_TRUE(j.contains("test_accuracy")) << line;
  }
  EXPECT_EQ(evals, 2);
  // train.monitor on the task's metric picked a best checkpoint.
  EXPECT_TRUE(std::filesystem::exists(run / "checkpoints" / "best")) << run;
  // A metric the task does not log is named with the ones it does.
  c.run.name = "unknown_metric";
  c.train.monitor = "test_nope";
  try {
    paratrain::testing::run_ranks(1, [&](comm::ProcessGroup& g) { Trainer(c, g, two_heads_parts()).fit(); });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("test_value_mse"), std::string::npos) << e.what();
  }
}

// A module other than a Sequential lists no layers: a pipeline refuses it by
// name; tensor parallelism refuses every program module.
TEST(UserTask, ModelsThatCannotBeCutAreAConfigError) {
  TrainConfig c = user_config(paratrain::testing::temp_dir("user-task"), "pp", 0);
  c.parallel.pp = 2;
  try {
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) { Trainer t(c, g, regression_parts()); });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be cut into pipeline stages"), std::string::npos) << e.what();
  }
  c.parallel.pp = 1;
  c.parallel.tp = 2;
  try {
    paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) { Trainer t(c, g, regression_parts()); });
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp = 2"), std::string::npos) << e.what();
  }
}

// A user's torch::nn::Sequential, cut at its children into 2 pipeline stages
// (issue 30, pipelines of user modules): gpipe, 1f1b and interleaved 1f1b
// (2 chunks per rank) with 4 micro-batches train the model one process
// trains, under the module's own names.
TEST(UserTask, ASequentialTrainsInPipelineStagesAsOneProcess) {
  const std::string dir = paratrain::testing::temp_dir("user-seq");
  TrainerParts parts;
  parts.model = any_module([](const TrainConfig& c) {
    const int64_t h = c.user.get<int64_t>("hidden");
    return torch::nn::Sequential(torch::nn::Linear(4, h), torch::nn::Tanh(), torch::nn::Linear(h, h),
                                 torch::nn::Tanh(), torch::nn::Linear(h, 1),
                                 torch::nn::Functional([](const at::Tensor& x) { return x.squeeze(1); }));
  });
  parts.task = std::make_shared<MseTask>();
  parts.data = [](const TrainConfig& c) {
    return Datasets{regression_rows(640, c.run.seed + 1, false), regression_rows(128, c.run.seed + 2, false)};
  };
  const Params reference = one_rank(user_config(dir, "one", 0), parts);
  EXPECT_EQ(names(reference),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b"}) {
    TrainConfig c = user_config(dir, schedule, 0);
    c.parallel.pp = 2;
    c.pipeline.schedule = schedule;
    c.pipeline.microbatches = 4;
    if (std::string(schedule) == "interleaved_1f1b") c.pipeline.virtual_stages = 2;  // 4 chunks of 6 children
    if (std::string(schedule) == "1f1b") c.pipeline.balance = "time";  // layers timed on the user's data shape
    const Params staged = two_ranks(c, parts);
    ASSERT_EQ(names(staged), names(reference));
    const double diff = relative_diff(staged, reference);
    std::printf("a user Sequential in 2 stages (%s) vs one process after 20 steps: %.2e\n", schedule, diff);
    EXPECT_LT(diff, 1e-5) << schedule;
  }
}

// A layer that reuses another layer's weight: it registers that layer as its
// own child ("shared"), the way LibTorch modules share a submodule, and adds
// a bias of its own.
struct ReusedLinearImpl : torch::nn::Module {
  explicit ReusedLinearImpl(torch::nn::Linear other) : shared(register_module("shared", std::move(other))) {
    bias = register_parameter("bias", torch::zeros({shared->weight.size(0)}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::nn::functional::linear(x, shared->weight, bias); }
  torch::nn::Linear shared;
  at::Tensor bias;
};
TORCH_MODULE(ReusedLinear);

// A Sequential whose children 2 and 4 share one weight, cut so that the two
// land on different stages. The tensor has two names ("2.weight" and
// "4.shared.weight"), as in one process; each stage keeps a copy under its
// own, the copies start equal and their gradients are summed after each
// backward, so the run equals one process, where autograd sums the two uses.
TEST(UserTask, WeightsTiedAcrossPipelineStagesStayTiedAndEqualOneProcess) {
  const std::string dir = paratrain::testing::temp_dir("user-tied");
  TrainerParts parts;
  parts.model = any_module([](const TrainConfig& c) {
    const int64_t h = c.user.get<int64_t>("hidden");
    torch::nn::Linear shared(h, h);
    return torch::nn::Sequential(torch::nn::Linear(4, h), torch::nn::Tanh(), shared, torch::nn::Tanh(),
                                 ReusedLinear(shared),
                                 torch::nn::Tanh(), torch::nn::Linear(h, 1),
                                 torch::nn::Functional([](const at::Tensor& x) { return x.squeeze(1); }));
  });
  parts.task = std::make_shared<MseTask>();
  parts.data = [](const TrainConfig& c) {
    return Datasets{regression_rows(640, c.run.seed + 1, false), regression_rows(128, c.run.seed + 2, false)};
  };
  // Clipping reaches its bound: the tied weight must count once in the norm.
  auto tied_config = [&](const std::string& name) {
    TrainConfig c = user_config(dir, name, 0);
    c.optimizer.clip_grad_norm = 0.2;
    return c;
  };
  const Params reference = one_rank(tied_config("one"), parts);
  auto value = [](const Params& p, const std::string& name) {
    for (const auto& [n, t] : p) {
      if (n == name) return t;
    }
    ADD_FAILURE() << name << " missing";
    return at::Tensor();
  };
  TrainConfig c = tied_config("staged");
  c.parallel.pp = 2;
  c.pipeline.schedule = "1f1b";
  c.pipeline.microbatches = 4;
  c.pipeline.split = {4, 4};  // children 0-3 (with "2") and 4-7 (with "4")
  const Params staged = two_ranks(c, parts);
  ASSERT_EQ(names(staged), names(reference));
  const double diff = relative_diff(staged, reference);
  std::printf("a Sequential with a weight tied across 2 stages vs one process after 20 steps: %.2e\n", diff);
  EXPECT_LT(diff, 1e-5);
  // Still one weight: the stage-1 copy equals the stage-0 original.
  EXPECT_TRUE(torch::equal(value(staged, "2.weight"), value(staged, "4.shared.weight")));
  // Stopped at step 10 and resumed from its checkpoint: the same as uninterrupted.
  TrainConfig first = c;
  first.run.name = "halves";
  first.train.max_steps = 10;
  two_ranks(first, parts);
  TrainConfig second = first;
  second.train.max_steps = 20;
  second.run.version = 0;
  second.train.resume = "auto";
  Params resumed;
  int64_t start_step = -1;
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& g) {
    Trainer t(second, g, parts);
    const auto r = t.fit();
    auto p = t.full_parameters();
    if (g.rank() == 0) resumed = std::move(p), start_step = r.start_step;
  });
  EXPECT_EQ(start_step, 10);  // it did resume (a fresh run would equal the uninterrupted one too)
  EXPECT_LT(relative_diff(resumed, staged), 1e-6);

  // Both uses on one stage (children 0-4 | 5-7): one tensor under two names
  // on that rank, counted and clipped once.
  TrainConfig same = c;
  same.run.name = "same_stage";
  same.pipeline.split = {5, 3};
  EXPECT_LT(relative_diff(two_ranks(same, parts), reference), 1e-5);

  // One process's checkpoint at step 10 (its optimizer state under the
  // first name, "2.weight") resumed in 2 stages: both copies take their
  // momentum from it and stay one weight, equal to one process throughout.
  TrainConfig alone = tied_config("alone");
  alone.train.max_steps = 10;
  one_rank(alone, parts);
  TrainConfig staged_resume = c;
  staged_resume.run.name = "staged_resume";
  staged_resume.train.resume = dir + "/alone/version_0/checkpoints/step_00000010";
  const Params crossed = two_ranks(staged_resume, parts);
  EXPECT_TRUE(torch::equal(value(crossed, "2.weight"), value(crossed, "4.shared.weight")));
  EXPECT_LT(relative_diff(crossed, reference), 1e-5);

  // Under ZeRO-1 over 2 replicas of each stage (pp = 2 x dp = 2): the copies'
  // gradients are summed after the reduction (ZeRO-1 keeps them whole), the
  // tensor counts once in the clipped norm, and its checkpoint (each copy's
  // pieces, the state under the first name) resumes on one process as the
  // uninterrupted one-process run.
  auto four_ranks = [&](const TrainConfig& config) { return n_ranks(4, config, parts); };
  TrainConfig zero1 = c;
  zero1.run.name = "staged_zero1";
  zero1.zero.stage = 1;
  // Stage 1's copy of the shared Linear's bias ("4.shared.bias") is not used
  // there (ReusedLinear has its own): its replicas reduce a zero for it.
  zero1.ddp.find_unused_parameters = true;
  const Params sharded = four_ranks(zero1);
  const double zero1_diff = relative_diff(sharded, reference);
  std::printf("the tied Sequential at pp=2 x dp=2 under ZeRO-1 vs one process after 20 steps: %.2e\n", zero1_diff);
  EXPECT_LT(zero1_diff, 1e-5);
  EXPECT_TRUE(torch::equal(value(sharded, "2.weight"), value(sharded, "4.shared.weight")));
  TrainConfig zero1_first = zero1;
  zero1_first.run.name = "zero1_halves";
  zero1_first.train.max_steps = 10;
  four_ranks(zero1_first);
  TrainConfig zero1_alone = tied_config("zero1_resumed_alone");
  zero1_alone.train.resume = dir + "/zero1_halves/version_0/checkpoints/step_00000010";
  EXPECT_LT(relative_diff(one_rank(zero1_alone, parts), reference), 1e-5);
  // ZeRO-2 keeps only its piece of each gradient: refused by name.
  TrainConfig zero2 = zero1;
  zero2.run.name = "staged_zero2";
  zero2.zero.stage = 2;
  try {
    four_ranks(zero2);
    ADD_FAILURE() << "a tied tensor across stages was accepted under ZeRO-2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use zero.stage = 0 or 1"), std::string::npos) << e.what();
  }

  // Both uses in two interleaved chunks of rank 0 (children 0-2 and 4-5):
  // ZeRO would shard and step the tensor once per chunk; refused by name.
  TrainConfig interleaved = c;
  interleaved.run.name = "interleaved";
  interleaved.pipeline.schedule = "interleaved_1f1b";
  interleaved.pipeline.virtual_stages = 2;
  interleaved.pipeline.split = {3, 1, 2, 2};
  interleaved.zero.stage = 1;
  try {
    two_ranks(interleaved, parts);
    ADD_FAILURE() << "a tensor in two chunks of one rank was accepted under ZeRO";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is shared by two model chunks on pipeline rank 0"), std::string::npos)
        << e.what();
  }
  // The control: the weight did train, by both uses.
  const Params untrained = [&] {
    TrainConfig zero = user_config(dir, "zero", 0);
    zero.train.max_steps = 1;
    zero.optimizer.lr = 1e-12;
    return one_rank(zero, parts);
  }();
  EXPECT_GT((value(staged, "2.weight") - value(untrained, "2.weight")).abs().max().item<double>(), 1e-3);
}

}  // namespace
}  // namespace paratrain::train

// Knowledge distillation (distill.*): the loss against a hand computation,
// and through the Trainer: a student distilled under DDP and ZeRO-3 at 2
// ranks equals one process, the teacher's weights never change, a teacher
// saved at 2 ranks loads at 1 and 3, and alpha = 0 is plain training (the
// control that shows the teacher matters at alpha > 0). Ranks are threads.
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/distill/distill_loss.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::TrainConfig;
using paratrain::train::Trainer;
using Params = std::vector<std::pair<std::string, at::Tensor>>;

TEST(DistillLoss, EqualsAHandComputation) {
  // Two predictions over three classes, T = 2, alpha = 0.3.
  const std::vector<std::vector<double>> s = {{1.0, 2.0, 0.5}, {0.0, -1.0, 3.0}};
  const std::vector<std::vector<double>> t = {{2.0, 1.0, 0.0}, {0.5, 0.5, 2.5}};
  const double temperature = 2.0, alpha = 0.3, task = 0.75;
  double kl = 0;
  for (size_t r = 0; r < s.size(); ++r) {
    double zs = 0, zt = 0;
    for (size_t c = 0; c < 3; ++c) {
      zs += std::exp(s[r][c] / temperature);
      zt += std::exp(t[r][c] / temperature);
    }
    for (size_t c = 0; c < 3; ++c) {
      const double ps = std::exp(s[r][c] / temperature) / zs, pt = std::exp(t[r][c] / temperature) / zt;
      kl += pt * std::log(pt / ps);
    }
  }
  kl /= 2;  // the mean over predictions
  const double expected = alpha * temperature * temperature * kl + (1 - alpha) * task;

  auto student = torch::tensor({1.0, 2.0, 0.5, 0.0, -1.0, 3.0}, torch::kFloat).reshape({2, 3}).requires_grad_(true);
  auto teacher = torch::tensor({2.0, 1.0, 0.0, 0.5, 0.5, 2.5}, torch::kFloat).reshape({2, 3});
  const auto parts = paratrain::train::distillation_loss(student, teacher, torch::tensor(task), temperature, alpha);
  EXPECT_NEAR(parts.soft.item<double>(), kl, 1e-6);
  EXPECT_NEAR(parts.hard.item<double>(), task, 1e-7);
  EXPECT_NEAR(parts.total.item<double>(), expected, 1e-6);
  // A language model's [B, L, V] logits: every position is a prediction.
  EXPECT_NEAR(paratrain::train::soft_target_kl(student.reshape({1, 2, 3}), teacher.reshape({1, 2, 3}), temperature)
                  .item<double>(),
              kl, 1e-6);
  // Equal logits: nothing to learn from the teacher. The gradient reaches the
  // student only.
  EXPECT_NEAR(paratrain::train::soft_target_kl(teacher, teacher, 3.0).item<double>(), 0.0, 1e-7);
  parts.total.backward();
  EXPECT_TRUE(student.grad().defined());
  EXPECT_THROW(paratrain::train::soft_target_kl(student, teacher.reshape({3, 2}), 1.0), c10::Error);
}

// Teacher: the CNN of 8x8 synthetic images; student: a small MLP on them.
TrainConfig base_config(const std::string& dir, const std::string& name) {
  TrainConfig c;
  c.run.name = name;
  c.run.output_dir = dir;
  c.run.seed = 7;
  c.run.log_every = 4;
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 480;
  c.data.synthetic_test_size = 96;
  c.data.synthetic_image_size = 8;
  c.data.global_batch_size = 24;
  c.optimizer.kind = "adam";
  c.optimizer.lr = 0.003;
  c.train.epochs = 1;
  c.train.max_steps = 12;
  c.train.eval_every_epochs = 0;
  return c;
}

TrainConfig teacher_config(const std::string& dir) {
  TrainConfig c = base_config(dir, "teacher");
  c.model.kind = "cnn";
  c.model.channels = {4, 8};
  c.model.cnn_hidden = 16;
  c.optimizer.lr = 0.01;
  c.train.max_steps = 20;
  c.train.eval_every_epochs = 1;  // one evaluation at the end (step 20)
  return c;
}

TrainConfig student_config(const std::string& dir, const std::string& name, const std::string& teacher) {
  TrainConfig c = base_config(dir, name);
  c.model.kind = "mlp";
  c.model.hidden = {16};
  c.distill.teacher = teacher;
  c.distill.temperature = 3.0;
  c.distill.alpha = 0.7;
  c.zero.unit_min_params = 200;
  return c;
}

struct RunResult {
  Params student, teacher;
};

RunResult train(const TrainConfig& cfg, int world) {
  RunResult run;
  paratrain::testing::run_ranks(world, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(cfg, g);
    t.fit();
    auto student = t.full_parameters();
    auto teacher = t.teacher_parameters();
    if (g.rank() == 0) run = {std::move(student), std::move(teacher)};
  });
  return run;
}

double relative_diff(const Params& a, const Params& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double scale = std::max(b[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i].second - b[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

// The teacher trained at 2 ranks under ZeRO-2 (sharded optimizer state in
// its checkpoint), once per test binary.
const std::string& trained_teacher() {
  static const std::string path = [] {
    auto dir = paratrain::testing::temp_dir("distill_teacher");
    auto cfg = teacher_config(dir);
    cfg.zero.stage = 2;
    train(cfg, 2);
    return dir + "/teacher";  // a run folder: its newest checkpoint
  }();
  return path;
}

void expect_teacher_as_saved(const Params& teacher, const std::string& run, const std::string& what) {
  const auto ckpt = std::filesystem::path(run) / "version_0" / "checkpoints" / "step_00000020";
  paratrain::checkpoint::ShardedReader reader(ckpt);
  ASSERT_FALSE(teacher.empty()) << what;
  for (const auto& [name, value] : teacher)
    EXPECT_TRUE(torch::equal(value, reader.read_whole("model/" + name))) << what << ": teacher " << name << " changed";
}

TEST(Distillation, DdpAndZero3AtTwoRanksEqualOneProcessAndTheTeacherNeverChanges) {
  const std::string teacher = trained_teacher();
  auto dir = paratrain::testing::temp_dir("distill");
  auto single = student_config(dir, "single", teacher);
  single.ddp.mode = "none";
  const RunResult oracle = train(single, 1);
  expect_teacher_as_saved(oracle.teacher, teacher, "one process");
  for (int64_t stage : {0, 3}) {
    auto cfg = student_config(dir, "zero" + std::to_string(stage), teacher);
    cfg.zero.stage = stage;
    const RunResult run = train(cfg, 2);
    const double diff = relative_diff(run.student, oracle.student);
    std::cout << "[distill] zero.stage " << stage << " at 2 ranks vs one process: relative diff " << diff << "\n";
    EXPECT_LT(diff, 1e-5) << "zero.stage " << stage;
    expect_teacher_as_saved(run.teacher, teacher, "zero.stage " + std::to_string(stage));
  }
  // Logged: the teacher once at the start, with the test metrics its own run
  // ended with; soft and hard parts at log points.
  double teacher_accuracy = -1;
  std::ifstream teacher_metrics(std::filesystem::path(teacher) / "version_0" / "metrics.jsonl");
  for (std::string line; std::getline(teacher_metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "eval") teacher_accuracy = j["test_accuracy"].get<double>();
  }
  ASSERT_GE(teacher_accuracy, 0.0);
  std::ifstream in(std::filesystem::path(dir) / "zero3" / "version_0" / "metrics.jsonl");
  int teacher_records = 0, distill_records = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "teacher") {
      ++teacher_records;
      EXPECT_DOUBLE_EQ(j["test_accuracy"].get<double>(), teacher_accuracy) << j;
    }
    if (j.value("kind", "") == "distill") {
      ++distill_records;
      EXPECT_GT(j["soft_loss"].get<double>(), 0.0) << j;
      EXPECT_GT(j["hard_loss"].get<double>(), 0.0) << j;
    }
  }
  EXPECT_EQ(teacher_records, 1);
  EXPECT_EQ(distill_records, 3);  // steps 4, 8, 12
}

TEST(Distillation, ATeacherSavedAtTwoRanksLoadsAtOneAndThreeAndAlphaZeroIsPlainTraining) {
  const std::string teacher = trained_teacher();
  auto dir = paratrain::testing::temp_dir("distill_worlds");
  auto one = student_config(dir, "one", teacher);
  one.ddp.mode = "none";
  const RunResult at_one = train(one, 1);
  auto three = student_config(dir, "three", teacher);
  const RunResult at_three = train(three, 3);
  EXPECT_LT(relative_diff(at_three.student, at_one.student), 1e-5);
  expect_teacher_as_saved(at_three.teacher, teacher, "3 ranks");

  // alpha = 0: the teacher's term vanishes, the run is plain training...
  auto plain = student_config(dir, "plain", "");
  plain.ddp.mode = "none";
  const RunResult labels_only = train(plain, 1);
  auto zero_alpha = student_config(dir, "alpha0", teacher);
  zero_alpha.ddp.mode = "none";
  zero_alpha.distill.alpha = 0.0;
  EXPECT_LT(relative_diff(train(zero_alpha, 1).student, labels_only.student), 1e-6);
  // ...and at alpha = 0.7 the teacher moves the student elsewhere.
  EXPECT_GT(relative_diff(at_one.student, labels_only.student), 1e-3);
}

// Pipelines: the teacher in two stages like the student; the loss runs per
// micro-batch on the last stage, against the teacher's logits of those rows
// (Note [The rows of a micro-batch's loss]); with recomputed activations the
// loss is computed again in backward.
TEST(Distillation, PipelineStagesEqualOneProcess) {
  const std::string teacher = trained_teacher();
  auto dir = paratrain::testing::temp_dir("distill_pp");
  auto single = student_config(dir, "single", teacher);
  single.ddp.mode = "none";
  const RunResult oracle = train(single, 1);
  for (const std::string layout : {"pp2", "pp2_recompute", "dp2_pp2"}) {
    auto cfg = student_config(dir, layout, teacher);
    cfg.parallel.pp = 2;
    cfg.pipeline.split = {1, 1};
    cfg.pipeline.microbatches = 3;  // 24 rows: 8 per micro-batch (12 at dp = 2: 4 each)
    cfg.pipeline.checkpoint_activations = layout == "pp2_recompute";
    const RunResult run = train(cfg, layout == "dp2_pp2" ? 4 : 2);
    const double diff = relative_diff(run.student, oracle.student);
    std::cout << "[distill] " << layout << " vs one process: relative diff " << diff << "\n";
    EXPECT_LT(diff, 1e-5) << layout;
    // The teacher in stages, gathered: as saved.
    expect_teacher_as_saved(run.teacher, teacher, layout);
    EXPECT_EQ(run.teacher.size(), oracle.teacher.size()) << layout;
  }
}

// A GPT teacher in 2 stages: its head on the last stage reads the embedding
// the first stage owns (a copy kept there, listed once when gathered); the
// student accumulates 2 micro-batches per step, each cut into 2 pipeline
// micro-batches whose losses take their rows of the teacher's logits. The
// distillation records reach metrics.jsonl from the last stage.
TEST(Distillation, AGptTeacherInStagesTeachesAPipelinedGptStudentAsOneProcess) {
  auto dir = paratrain::testing::temp_dir("distill_gpt");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 3);
  auto teacher = paratrain::testing::tiny_gpt_config(dir, corpus);
  teacher.run.name = "teacher";
  teacher.train.max_steps = 6;
  train(teacher, 1);
  const std::string teacher_run = dir + "/teacher";

  auto student = [&](const std::string& name) {
    auto c = paratrain::testing::tiny_gpt_config(dir, corpus);
    c.run.name = name;
    c.run.log_every = 2;
    c.model.layers = 1;
    c.train.max_steps = 6;
    c.train.accumulate = 2;
    c.distill.teacher = teacher_run;
    c.distill.temperature = 2.0;
    c.distill.alpha = 0.5;
    return c;
  };
  auto single = student("single");
  single.ddp.mode = "none";
  const RunResult oracle = train(single, 1);
  auto staged = student("staged");
  staged.parallel.pp = 2;
  staged.pipeline.microbatches = 2;
  const RunResult run = train(staged, 2);
  const double diff = relative_diff(run.student, oracle.student);
  std::cout << "[distill] GPT student at pp=2 with a 2-stage teacher vs one process: relative diff " << diff << "\n";
  EXPECT_LT(diff, 1e-5);
  ASSERT_EQ(run.teacher.size(), oracle.teacher.size());  // wte once
  EXPECT_LT(relative_diff(run.teacher, oracle.teacher), 1e-12);
  int distill_records = 0;
  std::ifstream in(std::filesystem::path(dir) / "staged" / "version_0" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) distill_records += line.find("\"distill\"") != std::string::npos;
  EXPECT_EQ(distill_records, 3);  // steps 2, 4, 6
}

// Under tensor parallelism (the megatron strategy): a GPT student at tp=2
// whose GPT teacher is split over the same tp ranks by its own plan, and a
// planned MLP student (parallel.tp_plan) whose CNN teacher, which has no
// plan, stays whole on both ranks. Each equals one process distilling.
TEST(Distillation, StudentsAtTp2WithTheirTeachersEqualOneProcess) {
  auto dir = paratrain::testing::temp_dir("distill_tp");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 3);
  auto teacher = paratrain::testing::tiny_gpt_config(dir, corpus);
  teacher.run.name = "teacher";
  teacher.train.max_steps = 6;
  train(teacher, 1);
  auto gpt_student = [&](const std::string& name) {
    auto c = paratrain::testing::tiny_gpt_config(dir, corpus);
    c.run.name = name;
    c.model.layers = 1;
    c.train.max_steps = 6;
    c.distill.teacher = dir + "/teacher";
    c.distill.temperature = 2.0;
    c.distill.alpha = 0.5;
    return c;
  };
  auto single = gpt_student("gpt_single");
  single.ddp.mode = "none";
  const RunResult oracle = train(single, 1);
  auto split = gpt_student("gpt_tp2");
  split.parallel.tp = 2;
  const RunResult run = train(split, 2);
  const double diff = relative_diff(run.student, oracle.student);
  std::cout << "[distill] GPT student at tp=2, teacher split over tp=2, vs one process: relative diff " << diff << "\n";
  EXPECT_LT(diff, 1e-5);
  EXPECT_LT(relative_diff(run.teacher, oracle.teacher), 1e-12);  // gathered whole, never changed
  // A student without the teacher's soft targets trains elsewhere.
  auto plain = gpt_student("gpt_tp2_alpha0");
  plain.parallel.tp = 2;
  plain.distill.alpha = 0.0;
  EXPECT_GT(relative_diff(train(plain, 2).student, oracle.student), 100 * std::max(diff, 1e-7));

  const std::string cnn_teacher = trained_teacher();
  auto mlp_single = student_config(dir, "mlp_single", cnn_teacher);
  mlp_single.ddp.mode = "none";
  const RunResult mlp_oracle = train(mlp_single, 1);
  auto mlp_tp = student_config(dir, "mlp_tp2", cnn_teacher);
  mlp_tp.parallel.tp = 2;
  mlp_tp.parallel.tp_plan = {"fc0=colwise", "fc1=rowwise"};
  const RunResult mlp_run = train(mlp_tp, 2);
  const double mlp_diff = relative_diff(mlp_run.student, mlp_oracle.student);
  std::cout << "[distill] planned MLP student at tp=2, whole CNN teacher, vs one process: relative diff " << mlp_diff
            << "\n";
  EXPECT_LT(mlp_diff, 1e-5);
}

// The megatron strategy's other axes: a GPT student with its sequences
// split over cp = 2 (each rank's loss against the teacher's logits of its
// chunk: Note [A loss over a sequence chunk]), in pipeline stages under
// ZeRO-1 (pp = 2 x dp = 2), at tp = 2 x pp = 2, tp = 2 x cp = 2 and cp = 2 x
// pp = 2; the teacher in stages where the student is (else split over tp),
// whole sequences on every cp rank. Each equals one process
// distilling the same global batch.
TEST(Distillation, GptStudentsUnderCpAndInMegatronStagesEqualOneProcess) {
  auto dir = paratrain::testing::temp_dir("distill_mesh");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 3);
  auto teacher = paratrain::testing::tiny_gpt_config(dir, corpus);
  teacher.run.name = "teacher";
  teacher.train.max_steps = 6;
  train(teacher, 1);
  auto student = [&](const std::string& name) {
    auto c = paratrain::testing::tiny_gpt_config(dir, corpus);
    c.run.name = name;
    c.run.log_every = 2;
    c.model.layers = 2;
    c.train.max_steps = 6;
    c.data.global_batch_size = 16;
    c.distill.teacher = dir + "/teacher";
    c.distill.temperature = 2.0;
    c.distill.alpha = 0.5;
    return c;
  };
  auto single = student("single");
  single.ddp.mode = "none";
  const RunResult oracle = train(single, 1);
  const auto layouts = paratrain::testing::megatron_layouts(
      {"cp2", "pp2_dp2_zero1", "tp2_pp2", "tp2_cp2", "cp2_pp2", "tp2_cp2_zero3"});
  for (const auto& layout : layouts) {
    auto c = student(layout.name);
    layout.apply(c);
    const RunResult run = train(c, layout.world);
    const double diff = relative_diff(run.student, oracle.student);
    std::cout << "[distill] GPT student at " << layout.name << " vs one process: relative diff " << diff << "\n";
    EXPECT_LT(diff, 1e-5) << layout.name;
    EXPECT_LT(relative_diff(run.teacher, oracle.teacher), 1e-12) << layout.name;  // never changed
    int distill_records = 0;
    std::ifstream in(std::filesystem::path(dir) / layout.name / "version_0" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      distill_records += line.find("\"distill\"") != std::string::npos;
      if (line.find("\"kind\":\"teacher\"") == std::string::npos) continue;
      // Laid out as the student: in its stages, split over its tp (also in
      // stages: Note [A teacher in stages split over tp]).
      const auto record = nlohmann::json::parse(line);
      EXPECT_EQ(record["stages"].get<int>(), layout.name.find("pp2") != std::string::npos ? 2 : 1) << layout.name;
      EXPECT_EQ(record["tp"].get<int>(), layout.name.find("tp2") != std::string::npos ? 2 : 1) << layout.name;
    }
    EXPECT_EQ(distill_records, 3) << layout.name;  // steps 2, 4, 6
  }
  // Without the teacher's soft targets the cp student trains elsewhere.
  auto plain = student("cp2_alpha0");
  plain.parallel.cp = 2;
  plain.distill.alpha = 0.0;
  EXPECT_GT(relative_diff(train(plain, 2).student, oracle.student), 1e-3);
}

// Parameter servers: the workers distill, the server only serves (its
// batches are never trained on, or empty with async dynamic batches).
TEST(Distillation, ParameterServerWorkersDistillAndServersDoNot) {
  const std::string teacher = trained_teacher();
  auto dir = paratrain::testing::temp_dir("distill_ps");
  auto single = student_config(dir, "single", teacher);
  single.ddp.mode = "none";
  const RunResult oracle = train(single, 1);
  auto sync = student_config(dir, "sync", teacher);
  sync.ps.servers = 1;
  EXPECT_LT(relative_diff(train(sync, 3).student, oracle.student), 1e-5);
  auto async = student_config(dir, "async", teacher);
  async.ps.servers = 1;
  async.ps.mode = "async";
  const RunResult run = train(async, 3);
  EXPECT_EQ(run.student.size(), oracle.student.size());
}

TEST(Distillation, ATeacherThatCannotServeIsAConfigError) {
  auto dir = paratrain::testing::temp_dir("distill_bad");
  auto missing = student_config(dir, "missing", dir + "/nowhere");
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    EXPECT_THROW(Trainer(missing, g), paratrain::ConfigError);
  });
  std::filesystem::create_directories(dir + "/empty_run/version_0");
  auto empty = student_config(dir, "empty", dir + "/empty_run");
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    try {
      Trainer t(empty, g);
      FAIL() << "expected ConfigError";
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("no committed checkpoint"), std::string::npos) << e.what();
    }
  });
  // The teacher read other data (fashion_mnist vs synthetic).
  auto other = student_config(dir, "other", trained_teacher());
  other.data.dataset = "fashion_mnist";
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    try {
      Trainer t(other, g);
      FAIL() << "expected ConfigError";
    } catch (const paratrain::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("data.dataset"), std::string::npos) << e.what();
    }
  });
  EXPECT_THROW(paratrain::train::config_from_toml_string(
                   "", {"distill.teacher=x", "zero.stage=3", "elastic.in_job=true"}),
               paratrain::ConfigError);
}

}  // namespace

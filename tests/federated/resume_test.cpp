// Resuming a federated run from the server's checkpoint (Note [Federated
// checkpoint]): FedAdam stopped after round 2 and resumed equals the
// uninterrupted 4 rounds, because the checkpoint carries the server
// optimizer's moments; the control resumes the model without them and
// lands elsewhere. Also through the CLI (train.resume=auto).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/federated/client.h"
#include "paratrain/federated/round.h"
#include "paratrain/federated/server_checkpoint.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace paratrain::federated {
namespace {

namespace fs = std::filesystem;

// Exact in practice: the resumed run replays the same float operations
// (sampling, shuffles and noise are functions of seed and round); 1e-6
// leaves room for nothing but a changed summation order.
constexpr double kTol = 1e-6;

train::TrainConfig fedadam_config() {
  train::TrainConfig c;
  c.data.dataset = "synthetic";
  c.data.synthetic_image_size = 4;
  c.data.synthetic_classes = 3;
  c.data.batch_size = 8;
  c.model.kind = "mlp";
  c.model.hidden = {8};
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.0;
  c.federated.clients = 6;
  c.federated.fraction = 0.5;
  c.federated.local_steps = 2;
  c.federated.server_optimizer = "adam";
  c.federated.server_lr = 0.03;
  c.federated.dp_clip = 1.0;  // the accountant's state travels too
  c.federated.dp_noise_multiplier = 0.5;
  c.run.seed = 9;
  return c;
}

data::TensorDataset data_for_test() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  return data::TensorDataset(at::randn({96, 1, 4, 4}, gen), at::randint(0, 3, {96}, gen, at::kLong));
}

// Rounds [first, last] on one process; with `from` the run resumes there first.
at::Tensor run_rounds(const train::TrainConfig& c, int64_t first, int64_t last, const fs::path& save_to = {},
                      const fs::path& from = {}, bool with_optimizer = true, int64_t* resumed_round = nullptr) {
  const auto train = data_for_test();
  auto model = testing::seeded(42, [&] { return train::make_model(c); });
  at::Tensor out;
  testing::run_ranks(1, [&](comm::ProcessGroup& group) {
    FederatedRun run(c, group, model, train);
    ServerProgress progress;
    if (!from.empty()) {
      ServerResumeOptions options;
      options.server_optimizer = with_optimizer;
      progress = load_server_checkpoint(from, run, c, options);
      if (resumed_round) *resumed_round = progress.round;
    }
    for (int64_t r = first; r <= last; ++r) {
      const auto report = run.run_round(r);
      if (report.applied)
        progress.accountant.add_rounds(static_cast<double>(report.sampled.size()) / report.pool, 0.5);
      progress.round = r;
    }
    if (!save_to.empty()) save_server_checkpoint(save_to, group, run, progress, c);
    out = run.global().clone();
  });
  return out;
}

TEST(FederatedResume, StoppedAfterRoundTwoAndResumedEqualsFourRoundsWithFedAdam) {
  const auto c = fedadam_config();
  const fs::path dir = fs::path(testing::temp_dir("fed_resume")) / "step_2";
  const at::Tensor uninterrupted = run_rounds(c, 1, 4);
  const at::Tensor after_two = run_rounds(c, 1, 2, dir);
  int64_t round = -1;
  const at::Tensor resumed = run_rounds(c, 3, 4, {}, dir, true, &round);
  EXPECT_EQ(round, 2);
  const double gap = (resumed - uninterrupted).abs().max().item<double>();
  std::printf("  resumed vs uninterrupted: max |diff| = %.3g\n", gap);
  EXPECT_LE(gap, kTol);
  // The control: the same model without the server's moments goes elsewhere.
  const at::Tensor fresh_moments = run_rounds(c, 3, 4, {}, dir, false);
  EXPECT_GT((fresh_moments - uninterrupted).abs().max().item<double>(), 100 * kTol);
  EXPECT_GT((after_two - uninterrupted).abs().max().item<double>(), 100 * kTol);
}

TEST(FederatedResume, RefusesAnotherServerOptimizer) {
  auto c = fedadam_config();
  const fs::path dir = fs::path(testing::temp_dir("fed_resume_kind")) / "step_1";
  run_rounds(c, 1, 1, dir);
  c.federated.server_optimizer = "yogi";
  try {
    run_rounds(c, 2, 2, {}, dir);
    FAIL() << "resuming adam's moments into yogi was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("federated.server_optimizer"), std::string::npos) << e.what();
  }
}

std::vector<nlohmann::json> read_metrics(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(FederatedResume, TheCliResumesTheNewestCheckpointWithTrainResumeAuto) {
  const auto dir = testing::temp_dir("fed_cli_resume");
  auto args = [&](const std::string& name, int rounds, bool resume) {
    std::vector<std::string> a{"federated", "-c", std::string(PARATRAIN_SOURCE_DIR) + "/configs/federated_fashion_mnist.toml",
                               "--set", "data.dataset=synthetic", "--set", "data.synthetic_train_size=300",
                               "--set", "data.synthetic_test_size=100", "--set", "data.synthetic_image_size=8",
                               "--set", "model.hidden=[16]", "--set", "federated.clients=10",
                               "--set", "federated.fraction=0.5", "--set", "federated.server_optimizer=adam",
                               "--set", "federated.server_lr=0.03", "--set", "federated.checkpoint_every=2",
                               "--set", "federated.rounds=" + std::to_string(rounds),
                               "--set", "run.output_dir=" + dir, "--set", "run.name=" + name};
    if (resume) a.insert(a.end(), {"--set", "train.resume=auto"});
    return a;
  };
  ASSERT_EQ(testing::run_cli(args("whole", 4, false)).exit_code, 0);
  const auto first = testing::run_cli(args("split", 2, false));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto second = testing::run_cli(args("split", 4, true));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  // One metrics file with rounds 1..4, and the same model as the whole run.
  const auto records = read_metrics(fs::path(dir) / "split" / "version_0" / "metrics.jsonl");
  ASSERT_EQ(records.size(), 4u) << second.output;
  EXPECT_EQ(records.back()["round"], 4);
  const auto whole = read_metrics(fs::path(dir) / "whole" / "version_0" / "metrics.jsonl");
  EXPECT_EQ(records.back()["test_accuracy"], whole.back()["test_accuracy"]);
  const auto compare = testing::run_cli({"checkpoint", "compare",
                                         (fs::path(dir) / "split" / "version_0" / "checkpoints" / "step_00000004").string(),
                                         (fs::path(dir) / "whole" / "version_0" / "checkpoints" / "step_00000004").string(),
                                         "--all", "--rtol", "1e-6"});
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
}

}  // namespace
}  // namespace paratrain::federated

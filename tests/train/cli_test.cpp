// `paratrain train` as a user runs it: real processes under `paratrain
// launch`, talking over Gloo/TCP. Success, resume, and each kind of bad input
// ending in a clear error without hanging or overwriting anything.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "paratrain/checkpoint/safetensors.h"
#include "tests/support/multi_rank.h"

namespace {

namespace fs = std::filesystem;
using paratrain::testing::run_cli;

// A small synthetic job: seconds, not minutes, on 2 cores.
std::string write_config(const std::string& dir, const std::string& extra = "") {
  auto path = dir + "/job.toml";
  std::ofstream(path) << "[run]\nname = \"job\"\noutput_dir = \"" << dir << "/runs\"\nlog_every = 4\n"
                      << "[model]\nhidden = [32]\n"
                      << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 512\n"
                      << "synthetic_test_size = 128\nsynthetic_image_size = 8\nbatch_size = 16\n"
                      << "[train]\nepochs = 1\n[world]\ntimeout_s = 20\n"
                      << extra;
  return path;
}

std::vector<std::string> launch2(const std::string& config, std::vector<std::string> more = {}) {
  std::vector<std::string> a{"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", config};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST(TrainCli, TwoRanksTrainAndWriteTheRunDirectory) {
  auto dir = paratrain::testing::temp_dir("cli-train");
  auto r = run_cli(launch2(write_config(dir)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 16 steps (1 epochs)"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/job/version_0/config.toml"));
  EXPECT_TRUE(fs::exists(dir + "/runs/job/version_0/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dir + "/runs/job/version_0/checkpoints/step_00000016/index.json"));
}

// A run stopped by train.max_steps inside its first epoch says how much of
// the epoch it trained (it said "0 epochs").
TEST(TrainCli, AStopInsideTheFirstEpochReportsTheFractionTrained) {
  auto dir = paratrain::testing::temp_dir("cli-max-steps");
  auto r = run_cli({"train", "--config", write_config(dir), "--set", "train.max_steps=8"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("done: 8 steps (0.25 epochs)"), std::string::npos) << r.output;  // 8 of 32 batches
}

// `paratrain checkpoint consolidate` of a run's checkpoint, read back.
paratrain::checkpoint::SafetensorsContents consolidated(const std::string& run_dir, const std::string& step_dir) {
  const auto out = run_dir + "/" + step_dir + ".consolidated.safetensors";
  auto r = run_cli({"checkpoint", "consolidate", run_dir + "/checkpoints/" + step_dir, "-o", out});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return paratrain::checkpoint::read_safetensors(out);
}

// The oracle across real processes, for every strategy: two ranks over
// Gloo/TCP with per-rank batch 16 end with the same weights and optimizer
// state as one process with batch 32, compared through the consolidated
// checkpoints each run wrote. Tolerance 1e-5 relative: float32 sums are
// taken in a different order (per-rank means, then the reduction).
class TrainCliStages : public ::testing::TestWithParam<int> {};

TEST_P(TrainCliStages, TwoProcessesTrainTheSameModelAsOne) {
  const int stage = GetParam();
  auto dir = paratrain::testing::temp_dir("cli-oracle");
  auto config = write_config(dir, "[optimizer]\nkind = \"adam\"\nlr = 0.001\n[zero]\nunit_min_params = 300\n");
  auto two = run_cli(launch2(config, {"--set", "run.name=two", "--set", "zero.stage=" + std::to_string(stage)}));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto one = run_cli({"train", "--config", config, "--set", "run.name=one", "--set", "data.batch_size=32",
                      "--set", "ddp.mode=none"});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two_ckpt = consolidated(dir + "/runs/two/version_0", "step_00000016");
  auto one_ckpt = consolidated(dir + "/runs/one/version_0", "step_00000016");
  int compared = 0;
  for (const auto& [name, t] : one_ckpt.tensors) {
    if (name.rfind("model/", 0) != 0 && name.rfind("optimizer/", 0) != 0) continue;
    ASSERT_TRUE(two_ckpt.tensors.count(name)) << name;
    const auto& other = two_ckpt.tensors.at(name);
    const double scale = std::max(t.abs().max().item<double>(), 1e-12);
    EXPECT_LT((t - other).abs().max().item<double>() / scale, 1e-5) << name << " at zero.stage " << stage;
    ++compared;
  }
  EXPECT_EQ(compared, 4 * 4);  // fc0 and fc1, weight and bias; each with step, exp_avg, exp_avg_sq
  // The same run without the reduction (each process on its own half of
  // every batch) must be far off, or this comparison could not fail.
  auto alone = run_cli({"train", "--config", config, "--set", "run.name=alone", "--set", "ddp.mode=none"});
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  auto alone_ckpt = consolidated(dir + "/runs/alone/version_0", "step_00000032");
  const auto& w = one_ckpt.tensors.at("model/fc0.weight");
  EXPECT_GT((w - alone_ckpt.tensors.at("model/fc0.weight")).abs().max().item<double>(), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(ZeroStages, TrainCliStages, ::testing::Values(0, 1, 2, 3));

TEST(TrainCli, UnknownConfigKeyIsAConfigErrorNamingTheKey) {
  auto dir = paratrain::testing::temp_dir("cli-badkey");
  auto r = run_cli(launch2(write_config(dir, "[ddp]\nbucket_size_mb = 4\n")), std::chrono::seconds(60));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("ddp.bucket_size_mb"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
}

TEST(TrainCli, WrongTypeInOverrideIsAConfigError) {
  auto dir = paratrain::testing::temp_dir("cli-badtype");
  auto r = run_cli({"train", "--config", write_config(dir), "--set", "data.batch_size=big"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("data.batch_size"), std::string::npos) << r.output;
}

// Issue 23 item 10: refused before training, in one line naming the key,
// instead of "value cannot be converted to type float without overflow".
TEST(TrainCli, ALearningRateBeyondFloat32IsAConfigErrorNamingTheKey) {
  auto dir = paratrain::testing::temp_dir("cli-bigLr");
  auto r = run_cli({"train", "--config", write_config(dir), "--set", "optimizer.lr=1e300"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("paratrain: configuration error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optimizer.lr = 1e+300 is not allowed: must be a finite number > 0 within float32's range"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("without overflow"), std::string::npos) << r.output;
}

TEST(TrainCli, MissingDatasetDirectoryIsAClearError) {
  auto dir = paratrain::testing::temp_dir("cli-nodata");
  auto r = run_cli({"train", "--config", write_config(dir), "--set", "data.dataset=fashion_mnist", "--set",
                    "data.dir=" + dir + "/no-such-dir"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(dir + "/no-such-dir"), std::string::npos) << r.output;
}

TEST(TrainCli, ResumeFromATruncatedCheckpointFailsAndLeavesItAlone) {
  auto dir = paratrain::testing::temp_dir("cli-trunc");
  auto config = write_config(dir);
  ASSERT_EQ(run_cli({"train", "--config", config, "--set", "train.max_steps=8"}).exit_code, 0);
  auto ckpt = dir + "/runs/job/version_0/checkpoints/step_00000008";
  auto file = ckpt + "/rank_0.safetensors";
  ASSERT_TRUE(fs::exists(file));
  fs::resize_file(file, fs::file_size(file) / 2);
  const auto size = fs::file_size(file);
  auto r = run_cli(launch2(config, {"--set", "train.resume=" + ckpt}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(file), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  EXPECT_EQ(fs::file_size(file), size);
  EXPECT_FALSE(fs::exists(dir + "/runs/job/version_0/checkpoints/step_00000016"));
}

// resume=auto falls back from a corrupt newest checkpoint to the one before,
// says so, and moves the corrupt one aside (kept for a post-mortem, never
// overwritten by the continued run).
TEST(TrainCli, ResumeAutoFallsBackFromACorruptNewestCheckpoint) {
  auto dir = paratrain::testing::temp_dir("cli-fallback");
  auto config = write_config(dir);
  ASSERT_EQ(run_cli(launch2(config, {"--set", "train.max_steps=8", "--set", "train.checkpoint_every_steps=4"}))
                .exit_code, 0);
  auto newest = dir + "/runs/job/version_0/checkpoints/step_00000008/rank_0.safetensors";
  ASSERT_TRUE(fs::exists(newest));
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');  // one flipped byte in tensor data: only the checksum can tell
  }
  auto r = run_cli(launch2(config, {"--set", "train.resume=auto"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipping checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_00000004 at epoch 1, batch 4, step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 16 steps"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/job/version_0/checkpoints/step_00000008.unreadable/rank_0.safetensors"));
}

TEST(TrainCli, TwoRanksResumeFromTheLatestCheckpoint) {
  auto dir = paratrain::testing::temp_dir("cli-resume");
  auto config = write_config(dir);
  ASSERT_EQ(run_cli(launch2(config, {"--set", "train.max_steps=8"})).exit_code, 0);
  auto r = run_cli(launch2(config, {"--set", "train.resume=auto"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_00000008 at epoch 1, batch 8, step 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 16 steps"), std::string::npos) << r.output;
}

// A port nobody listens on right now (the kernel's pick for port 0).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(TrainCli, ARankThatNeverJoinsIsATimeoutNamingIt) {
  auto dir = paratrain::testing::temp_dir("cli-nojoin");
  // Rank 0 of a 2-rank world, started alone: rank 1 never arrives.
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(free_port()).c_str(), 1);
  auto r = run_cli({"train", "--config", write_config(dir), "--set", "world.timeout_s=3"}, std::chrono::seconds(60));
  for (const char* k : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(k);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("rank(s) 1 of world size 2 never arrived"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30);
}

}  // namespace

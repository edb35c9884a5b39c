// No silent loss of progress around checkpoints (issue 23, defects 5-9):
// train.resume = auto never lets an empty version or a damaged checkpoint
// hide older progress, moves every damaged checkpoint aside instead of saving
// over it, never deletes what it could not read, and refuses non-finite
// values; the offline tools refuse to overwrite their input and report
// damage with their exit code. Runs are 1-rank Trainers on the tiny config
// (tiny_run.h); the tools run as `build/paratrain`.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/checkpoint/checksum.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_run.h"

namespace {

namespace fs = std::filesystem;
namespace pt = paratrain::train;
using paratrain::testing::run_cli;

// One epoch of 8 steps on one rank, checkpoints at steps 4 and 8.
pt::TrainConfig tiny_config(const std::string& dir) {
  auto c = paratrain::testing::tiny_run_config(dir, "job", /*epochs=*/1, /*log_every=*/0);
  c.train.checkpoint_every_steps = 4;
  return c;
}

pt::TrainResult fit(const pt::TrainConfig& c) {
  pt::TrainResult result;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) { result = pt::Trainer(c, g).fit(); });
  return result;
}

fs::path step_dir(const std::string& dir, int version, int64_t step) {
  return paratrain::checkpoint::checkpoint_dir(fs::path(dir) / "job" / ("version_" + std::to_string(version)), step);
}

// Rewrites the first tensor of `dir`'s rank 0 shard whose name starts with
// `prefix` (element 0 := value) and fixes the index's size and checksum, so
// only the value itself is wrong.
void poison(const fs::path& dir, const std::string& prefix, float value) {
  const auto file = dir / "rank_0.safetensors";
  auto contents = paratrain::checkpoint::read_safetensors(file);
  bool done = false;
  for (auto& [name, t] : contents.tensors) {
    if (name.rfind(prefix, 0) != 0 || t.scalar_type() != at::kFloat) continue;
    t.view({-1})[0].fill_(value);
    done = true;
    break;
  }
  ASSERT_TRUE(done) << "no float tensor named " << prefix << "* in " << file;
  contents.metadata.erase(paratrain::checkpoint::kDataChecksumKey);
  paratrain::checkpoint::write_safetensors(file, contents);
  nlohmann::json index;
  std::ifstream(dir / "index.json") >> index;
  for (auto& f : index["files"]) {
    if (f["file"] != "rank_0.safetensors") continue;
    f["bytes"] = fs::file_size(file);
    f["crc32"] = paratrain::checkpoint::crc32_hex(paratrain::checkpoint::file_crc32(file));
  }
  std::ofstream(dir / "index.json") << index.dump();
}

// Defect 5: a start that fails before its first save removes the version
// it made (it wrote nothing there). A version without checkpoints can still
// exist (a process killed between making its folder and its first save:
// made by hand here); resume = auto must continue version_0's checkpoint,
// not start version_1 from step 0. The run folder holds no checkpoints/ of
// its own.
TEST(CheckpointSafety, ResumeAutoPassesOverAVersionWithoutCheckpoints) {
  const auto dir = paratrain::testing::temp_dir("safety-versions");
  auto c = tiny_config(dir);
  ASSERT_EQ(fit(c).steps, 8);
  auto bad = c;
  bad.data.batch_size = 70000;  // larger than the dataset: fails after making version_1
  EXPECT_THROW(fit(bad), paratrain::Error);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "job" / "version_1")) << "the failed start left its empty version";
  fs::create_directories(fs::path(dir) / "job" / "version_1" / "checkpoints");
  ASSERT_TRUE(paratrain::checkpoint::list_checkpoints(fs::path(dir) / "job" / "version_1").empty());

  c.train.resume = "auto";
  c.train.epochs = 2;
  const auto resumed = fit(c);
  EXPECT_EQ(resumed.run_dir, fs::path(dir) / "job" / "version_0");
  EXPECT_EQ(resumed.start_step, 8);
  EXPECT_EQ(resumed.steps, 16);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "job" / "checkpoints"));
}

// Defect 8: every kind of damage auto skips is moved aside as
// step_N.unreadable (kept as it was), and the continued run saves step_N anew.
enum class Damage { kTruncated, kEmptied, kDeleted, kIndexNotJson, kIndexInvalid };

class DamagedCheckpoint : public ::testing::TestWithParam<Damage> {};

TEST_P(DamagedCheckpoint, ResumeAutoMovesItAsideAndFallsBack) {
  const auto dir = paratrain::testing::temp_dir("safety-damage");
  auto c = tiny_config(dir);
  ASSERT_EQ(fit(c).steps, 8);
  const auto newest = step_dir(dir, 0, 8);
  const auto shard = newest / "rank_0.safetensors";
  switch (GetParam()) {
    case Damage::kTruncated: fs::resize_file(shard, fs::file_size(shard) / 2); break;
    case Damage::kEmptied: fs::resize_file(shard, 0); break;
    case Damage::kDeleted: fs::remove(shard); break;
    case Damage::kIndexNotJson: std::ofstream(newest / "index.json") << "{\"format\": "; break;
    case Damage::kIndexInvalid: std::ofstream(newest / "index.json") << "{}"; break;
  }
  std::ifstream damaged_index(newest / "index.json");
  const std::string index_text((std::istreambuf_iterator<char>(damaged_index)), std::istreambuf_iterator<char>());

  c.train.resume = "auto";
  const auto resumed = fit(c);
  EXPECT_EQ(resumed.start_step, 4);
  EXPECT_EQ(resumed.steps, 8);
  auto aside = newest;
  aside += ".unreadable";
  ASSERT_TRUE(fs::is_directory(aside));
  std::ifstream kept(aside / "index.json");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>()), index_text);
  EXPECT_EQ(fs::exists(aside / "rank_0.safetensors"), GetParam() != Damage::kDeleted);
  EXPECT_NO_THROW(paratrain::checkpoint::check_checkpoint(newest));  // saved afresh, not over the damaged one
}

INSTANTIATE_TEST_SUITE_P(Kinds, DamagedCheckpoint,
                         ::testing::Values(Damage::kTruncated, Damage::kEmptied, Damage::kDeleted,
                                           Damage::kIndexNotJson, Damage::kIndexInvalid));

// Defect 9: a NaN weight (checksums fixed up) is damage like any other: auto
// falls back and moves it aside instead of stopping.
TEST(CheckpointSafety, ResumeAutoFallsBackFromANaNParameter) {
  const auto dir = paratrain::testing::temp_dir("safety-nan");
  auto c = tiny_config(dir);
  ASSERT_EQ(fit(c).steps, 8);
  poison(step_dir(dir, 0, 8), "model/", std::nanf(""));
  c.train.resume = "auto";
  const auto resumed = fit(c);
  EXPECT_EQ(resumed.start_step, 4);
  auto aside = step_dir(dir, 0, 8);
  aside += ".unreadable";
  EXPECT_TRUE(fs::exists(aside / "rank_0.safetensors"));
}

// Defect 9: an inf in the optimizer state is refused at load, naming it.
TEST(CheckpointSafety, InfInOptimizerStateIsRefusedAtLoad) {
  const auto dir = paratrain::testing::temp_dir("safety-inf");
  auto c = tiny_config(dir);
  ASSERT_EQ(fit(c).steps, 8);
  const auto ckpt = step_dir(dir, 0, 8);
  poison(ckpt, "optimizer/", std::numeric_limits<float>::infinity());
  c.train.resume = ckpt.string();
  try {
    fit(c);
    FAIL() << "expected a CheckpointError";
  } catch (const paratrain::CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("non-finite"), std::string::npos) << what;
    EXPECT_NE(what.find("'optimizer/"), std::string::npos) << what;
  }
  EXPECT_TRUE(fs::exists(ckpt / "index.json"));  // an explicit path is never moved
}

// Defect 9: consolidate warns about NaN; inspect fails on a checksum error.
TEST(CheckpointSafety, ToolsReportNonFiniteValuesAndChecksumErrors) {
  const auto dir = paratrain::testing::temp_dir("safety-tools");
  ASSERT_EQ(fit(tiny_config(dir)).steps, 8);
  const auto nan_ckpt = step_dir(dir, 0, 8);
  poison(nan_ckpt, "model/", std::nanf(""));
  auto r = run_cli({"checkpoint", "consolidate", nan_ckpt.string(), "-o", dir + "/nan.safetensors"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;

  const auto ckpt = step_dir(dir, 0, 4);
  r = run_cli({"checkpoint", "inspect", ckpt.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  {
    std::fstream f(ckpt / "rank_0.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');  // same size: only the checksum can tell
  }
  r = run_cli({"checkpoint", "inspect", ckpt.string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("fails its checksum"), std::string::npos) << r.output;
}

// Defect 6: consolidate refuses an output inside the checkpoint it reads.
TEST(CheckpointSafety, ConsolidateRefusesToWriteIntoItsInput) {
  const auto dir = paratrain::testing::temp_dir("safety-consolidate");
  ASSERT_EQ(fit(tiny_config(dir)).steps, 8);
  const auto ckpt = step_dir(dir, 0, 8);
  const auto shard = ckpt / "rank_0.safetensors";
  const auto crc = paratrain::checkpoint::file_crc32(shard);
  for (const auto& out : {shard, ckpt / "new.safetensors", ckpt / ".." / "step_00000008" / "x.safetensors"}) {
    auto r = run_cli({"checkpoint", "consolidate", ckpt.string(), "-o", out.string()});
    EXPECT_EQ(r.exit_code, 1) << out << "\n" << r.output;
    EXPECT_NE(r.output.find("inside the checkpoint"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(ckpt / "new.safetensors"));
  }
  EXPECT_EQ(paratrain::checkpoint::file_crc32(shard), crc);
  EXPECT_NO_THROW(paratrain::checkpoint::check_checkpoint(ckpt));
}

// Runs `cmd` through the shell; exit code and stdout + stderr.
paratrain::testing::ProcessResult shell(const std::string& cmd) {
  paratrain::testing::ProcessResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Defect 7: a checkpoint this user may not read is not an interrupted or
// damaged save. Root reads mode 000 anyway, so the CLI runs as `nobody`
// (setpriv) over a run tree it may write, except the newest checkpoint.
TEST(CheckpointSafety, AnUnreadableCheckpointIsNamedAndLeftAlone) {
  if (geteuid() != 0 || shell("setpriv --version").exit_code != 0)
    GTEST_SKIP() << "needs root and setpriv to run the CLI as another user";
  const auto dir = paratrain::testing::temp_dir("safety-perm");
  ASSERT_EQ(fit(tiny_config(dir)).steps, 8);
  const auto config = fs::path(dir) / "job" / "version_0" / "config.toml";
  for (const auto& e : fs::recursive_directory_iterator(dir))
    fs::permissions(e.path(), fs::perms::all, fs::perm_options::add);
  fs::permissions(dir, fs::perms::all, fs::perm_options::add);
  const auto ckpt = step_dir(dir, 0, 8);
  fs::permissions(ckpt, fs::perms::none, fs::perm_options::replace);
  const std::string as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups " + std::string(PARATRAIN_CLI);

  auto r = shell(as_nobody + " train -c " + config.string() + " --set train.resume=auto");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cannot read checkpoint '" + ckpt.string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Permission denied"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("could not delete"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("resumed from"), std::string::npos) << r.output;

  r = shell(as_nobody + " train -c " + config.string() + " --set train.resume=" + ckpt.string());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Permission denied"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("filesystem error"), std::string::npos) << r.output;

  fs::permissions(ckpt, fs::perms::owner_all, fs::perm_options::replace);
  EXPECT_NO_THROW(paratrain::checkpoint::check_checkpoint(ckpt));  // still there, as it was
  EXPECT_FALSE(fs::exists(fs::path(ckpt.string() + ".unreadable")));
}

}  // namespace

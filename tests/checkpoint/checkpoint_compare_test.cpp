// `paratrain checkpoint compare`: two small checkpoints written with the real
// writers (single files and a 2-rank sharded directory), one identical and one
// with one tensor perturbed by 1e-3 relative. The comparison must find exactly
// that tensor with exactly that relative difference, list names present on one
// side only, name shape/dtype mismatches, and turn all of it into exit codes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"
#include "paratrain/checkpoint/compare.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/sharded.h"
#include "tests/support/multi_rank.h"

namespace ck = paratrain::checkpoint;
namespace fs = std::filesystem;

namespace {

// The names real checkpoints use (checkpoint_metadata.h): model/<param>,
// optimizer/<param>/<field>.
ck::SafetensorsContents reference_contents() {
  ck::SafetensorsContents c;
  c.tensors["model/fc.weight"] = at::linspace(-2, 2, 12).reshape({4, 3});  // max|w| = 2
  c.tensors["model/fc.bias"] = at::tensor({0.5f, -0.25f, 0.125f, 1.0f});
  c.tensors["model/scale"] = at::tensor({1.5f, -2.0f});
  c.tensors["optimizer/fc.weight/momentum_buffer"] = at::linspace(0, 1, 12).reshape({4, 3});
  c.tensors["optimizer/fc.weight/step"] = at::tensor(int64_t{3});
  c.metadata["format"] = "paratrain-checkpoint/1";
  return c;
}

fs::path write(const fs::path& path, const ck::SafetensorsContents& c) {
  ck::SafetensorsWriteOptions o;
  o.sync = false;  // scratch files
  ck::write_safetensors(path, c, o);
  return path;
}

// One element of `name` moved by 1e-3 of the tensor's largest magnitude.
ck::SafetensorsContents perturbed(ck::SafetensorsContents c, const std::string& name) {
  at::Tensor t = c.tensors.at(name).clone();
  t.view(-1)[5] += 1e-3 * t.abs().max().item<double>();
  c.tensors[name] = t;
  return c;
}

struct Files {
  fs::path dir, ref, same, bumped;
};

Files make_files(const std::string& tag) {
  Files f;
  f.dir = paratrain::testing::temp_dir(tag);
  f.ref = write(f.dir / "ref.safetensors", reference_contents());
  f.same = write(f.dir / "same.safetensors", reference_contents());
  f.bumped = write(f.dir / "bumped.safetensors", perturbed(reference_contents(), "model/fc.weight"));
  return f;
}

const ck::TensorDiff& find(const ck::CompareReport& r, const std::string& name) {
  for (const auto& d : r.diffs)
    if (d.name == name) return d;
  throw std::runtime_error("no diff for " + name);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(CheckpointCompare, IdenticalCheckpointsAgreeOnEveryModelTensor) {
  const Files f = make_files("cmp-same");
  const ck::CompareReport r = ck::compare_checkpoints(f.same, f.ref);
  EXPECT_TRUE(r.ok()) << r.format();
  ASSERT_EQ(r.diffs.size(), 3u);  // model/ only by default
  for (const auto& d : r.diffs) {
    EXPECT_TRUE(d.name.starts_with("model/")) << d.name;
    EXPECT_EQ(d.max_abs, 0.0) << d.name;
    EXPECT_TRUE(d.ok) << d.name;
  }
  EXPECT_EQ(find(r, "model/fc.weight").shape, (std::vector<int64_t>{4, 3}));
  EXPECT_TRUE(contains(r.format(), "3 tensors compared, worst relative difference 0.000e+00")) << r.format();
  EXPECT_TRUE(contains(r.format(), "within rtol 1e-05")) << r.format();
}

TEST(CheckpointCompare, APerturbedTensorIsNamedWithItsRelativeDifference) {
  const Files f = make_files("cmp-bumped");
  const ck::CompareReport r = ck::compare_checkpoints(f.bumped, f.ref);
  EXPECT_FALSE(r.ok());
  const auto& w = find(r, "model/fc.weight");
  EXPECT_FALSE(w.ok);
  // 1e-3 of max|w| = 2, up to float32 rounding of the bumped element (~1e-8 of it).
  EXPECT_NEAR(w.max_abs, 2e-3, 1e-7);
  EXPECT_NEAR(w.rel, 1e-3, 1e-7);
  EXPECT_TRUE(find(r, "model/fc.bias").ok);
  EXPECT_TRUE(find(r, "model/scale").ok);
  const std::string text = r.format();
  EXPECT_TRUE(contains(text, "DIFF")) << text;
  EXPECT_TRUE(contains(text, "worst relative difference 1.000e-03 (model/fc.weight)")) << text;
  EXPECT_TRUE(contains(text, "exceeds rtol 1e-05")) << text;

  // The same difference under a looser tolerance agrees: the threshold decides.
  ck::CompareOptions loose;
  loose.rtol = 2e-3;
  EXPECT_TRUE(ck::compare_checkpoints(f.bumped, f.ref, loose).ok());
}

TEST(CheckpointCompare, PrefixAndAllChooseWhichTensorsCount) {
  const Files f = make_files("cmp-prefix");
  const fs::path opt = write(f.dir / "opt.safetensors",
                             perturbed(reference_contents(), "optimizer/fc.weight/momentum_buffer"));
  EXPECT_TRUE(ck::compare_checkpoints(opt, f.ref).ok());  // model/ only: the optimizer is not looked at
  ck::CompareOptions all;
  all.all = true;
  const auto r = ck::compare_checkpoints(opt, f.ref, all);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.diffs.size(), 5u);
  EXPECT_FALSE(find(r, "optimizer/fc.weight/momentum_buffer").ok);
  EXPECT_EQ(find(r, "optimizer/fc.weight/step").max_abs, 0.0);
  ck::CompareOptions optimizer_only;
  optimizer_only.prefix = "optimizer/";
  EXPECT_EQ(ck::compare_checkpoints(opt, f.ref, optimizer_only).diffs.size(), 2u);
  // A prefix that matches nothing is not agreement.
  ck::CompareOptions typo;
  typo.prefix = "modle/";
  const auto none = ck::compare_checkpoints(f.same, f.ref, typo);
  EXPECT_FALSE(none.ok());
  EXPECT_TRUE(contains(none.format(), "0 tensors compared")) << none.format();
}

TEST(CheckpointCompare, NamesOnOneSideAndShapeOrDtypeMismatchesAreListed) {
  const Files f = make_files("cmp-names");
  auto other = reference_contents();
  other.tensors.erase("model/fc.bias");
  other.tensors["model/extra"] = at::zeros({2});
  other.tensors["model/fc.weight"] = other.tensors["model/fc.weight"].t().contiguous();  // [3, 4]
  other.tensors["model/scale"] = other.tensors["model/scale"].to(at::kDouble);
  const fs::path b = write(f.dir / "other.safetensors", other);
  const auto r = ck::compare_checkpoints(f.ref, b);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.only_in_a, std::vector<std::string>{"model/fc.bias"});
  EXPECT_EQ(r.only_in_b, std::vector<std::string>{"model/extra"});
  ASSERT_EQ(r.mismatched.size(), 2u);
  EXPECT_EQ(r.mismatched[0], "model/fc.weight: A is F32 [4, 3], B is F32 [3, 4]");
  EXPECT_EQ(r.mismatched[1], "model/scale: A is F32 [2], B is F64 [2]");
  EXPECT_TRUE(r.diffs.empty());
  const std::string text = r.format();
  for (const char* needle : {"only in A: model/fc.bias", "only in B: model/extra", "shape/dtype mismatch: model/fc.weight",
                             "1 only in A, 1 only in B, 2 mismatched"})
    EXPECT_TRUE(contains(text, needle)) << needle << "\n" << text;
}

TEST(CheckpointCompare, AMissingPathIsACheckpointErrorNamingIt) {
  const Files f = make_files("cmp-missing");
  const fs::path missing = f.dir / "nope" / "step_00000007";
  try {
    ck::compare_checkpoints(f.ref, missing);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const paratrain::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), missing.string())) << e.what();
  }
  // A directory that is not a checkpoint (no index.json) is named too.
  try {
    ck::compare_checkpoints(f.dir, f.ref);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const paratrain::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), f.dir.string())) << e.what();
  }
}

// The model tensors of reference_contents() saved by 2 ranks, each holding
// the half of every flat tensor, through the real sharded writer.
fs::path save_sharded_reference(const fs::path& dir) {
  const auto ref = reference_contents();
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    ck::CheckpointContents contents;
    contents.save_rng = false;
    for (const auto& [key, t] : ref.tensors) {
      if (!key.starts_with("model/")) continue;
      const int64_t half = t.numel() / 2, lo = g.rank() == 0 ? 0 : half, n = g.rank() == 0 ? half : t.numel() - half;
      contents.model.push_back({key.substr(6), t.sizes().vec(), lo, t.reshape(-1).narrow(0, lo, n).clone(), true});
    }
    ck::ShardedSaveOptions o;
    o.sync = false;
    ck::save_sharded_checkpoint(dir, g, contents, o);
  });
  return dir;
}

TEST(CheckpointCompare, AShardedDirectoryComparesAgainstAFile) {
  const Files f = make_files("cmp-sharded");
  const fs::path dir = save_sharded_reference(f.dir / "step_00000003");
  const auto same = ck::compare_checkpoints(dir, f.ref);
  EXPECT_TRUE(same.ok()) << same.format();
  EXPECT_EQ(same.diffs.size(), 3u);
  for (const auto& d : same.diffs) EXPECT_EQ(d.max_abs, 0.0) << d.name;

  const auto bumped = ck::compare_checkpoints(dir, f.bumped);
  EXPECT_FALSE(bumped.ok());
  EXPECT_FALSE(find(bumped, "model/fc.weight").ok);
  EXPECT_NEAR(find(bumped, "model/fc.weight").rel, 1e-3, 1e-7);

  // --all: the file's optimizer state has no counterpart in the directory.
  ck::CompareOptions all;
  all.all = true;
  const auto everything = ck::compare_checkpoints(dir, f.ref, all);
  EXPECT_FALSE(everything.ok());
  EXPECT_EQ(everything.only_in_b,
            (std::vector<std::string>{"optimizer/fc.weight/momentum_buffer", "optimizer/fc.weight/step"}));
  // Every shared tensor agrees, so the last line says why the comparison still fails.
  EXPECT_TRUE(contains(everything.format(), "within rtol 1e-05; names differ (listed above)")) << everything.format();
}

TEST(CheckpointCompare, CliExitCodesAndSummary) {
  const Files f = make_files("cmp-cli");
  const fs::path dir = save_sharded_reference(f.dir / "step_00000003");
  auto same = paratrain::testing::run_cli({"checkpoint", "compare", dir.string(), f.ref.string()});
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_TRUE(contains(same.output, "3 tensors compared, worst relative difference 0.000e+00")) << same.output;
  EXPECT_TRUE(contains(same.output, "within rtol 1e-05")) << same.output;

  // --all: the optimizer state is compared too (5 tensors), fc.weight is still the worst.
  auto bumped = paratrain::testing::run_cli({"checkpoint", "compare", f.bumped.string(), f.ref.string(), "--all"});
  EXPECT_EQ(bumped.exit_code, 1) << bumped.output;
  EXPECT_TRUE(contains(bumped.output, "5 tensors compared, worst relative difference 1.000e-03 (model/fc.weight)"))
      << bumped.output;
  EXPECT_TRUE(contains(bumped.output, "exceeds rtol 1e-05")) << bumped.output;

  auto loose = paratrain::testing::run_cli(
      {"checkpoint", "compare", f.bumped.string(), f.ref.string(), "--rtol", "2e-3", "--prefix", "model/fc."});
  EXPECT_EQ(loose.exit_code, 0) << loose.output;
  EXPECT_TRUE(contains(loose.output, "2 tensors compared")) << loose.output;
  EXPECT_TRUE(contains(loose.output, "within rtol 0.002")) << loose.output;

  auto missing = paratrain::testing::run_cli({"checkpoint", "compare", (f.dir / "nope").string(), f.ref.string()});
  EXPECT_NE(missing.exit_code, 0) << missing.output;
  EXPECT_TRUE(contains(missing.output, (f.dir / "nope").string())) << missing.output;
}

}  // namespace

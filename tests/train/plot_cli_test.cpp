// `paratrain plot RUN_DIR...` as a user runs it: two runs' metrics.jsonl (one
// in today's format, one from before the "samples"/"epoch_progress" fields)
// become PNG charts with one line per run; a folder that is not a run fails
// with a message saying so.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "paratrain/train/run/plots.h"
#include "tests/support/multi_rank.h"

namespace {

namespace fs = std::filesystem;
using paratrain::testing::run_cli;

fs::path fake_run(const std::string& name, bool old_format) {
  const fs::path run = fs::path(paratrain::testing::temp_dir("cli-plot")) / name;
  fs::create_directories(run);
  std::ofstream out(run / "metrics.jsonl");
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int half = 1; half <= 2; ++half) {
      const int step = epoch * 10 + half * 5;
      out << "{\"kind\":\"train\",\"epoch\":" << epoch << ",\"step\":" << step;
      if (!old_format) out << ",\"samples\":" << step * 64 << ",\"epoch_progress\":" << epoch + half * 0.5;
      out << ",\"loss\":" << 1.0 / step << "}\n";
    }
    out << "{\"kind\":\"eval\",\"epoch\":" << epoch << ",\"step\":" << (epoch + 1) * 10;
    if (!old_format) out << ",\"samples\":" << (epoch + 1) * 640;
    out << ",\"test_loss\":0.5,\"test_accuracy\":" << 0.8 + 0.01 * epoch << "}\n";
  }
  return run;
}

bool is_png(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in && std::string(magic + 1, 3) == "PNG";
}

TEST(PlotSeries, OldRunsGetTheirAxesDerived) {
  const auto run = paratrain::train::read_run_series(fake_run("old", true));
  ASSERT_EQ(run.train.size(), 6u);
  ASSERT_EQ(run.eval.size(), 3u);
  EXPECT_EQ(run.label, "old");
  // 10 steps per epoch (the first eval row closes epoch 1 at step 10).
  EXPECT_DOUBLE_EQ(run.train[1].epoch, 1.0);
  EXPECT_DOUBLE_EQ(run.eval[2].epoch, 3.0);
  EXPECT_DOUBLE_EQ(run.eval[2].accuracy, 0.82);
}

TEST(PlotCli, DrawsEveryRunOnEachChart) {
  const auto a = fake_run("small_batch", false);
  const auto b = fake_run("large_batch", true);
  const auto out = fs::path(paratrain::testing::temp_dir("cli-plot")) / "charts";
  auto r = run_cli({"plot", a.string(), b.string(), "-o", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* png : {"accuracy_vs_epoch.png", "accuracy_vs_samples.png", "loss_vs_epoch.png",
                          "loss_vs_samples.png"}) {
    EXPECT_TRUE(is_png(out / png)) << png << "\n" << r.output;
    EXPECT_NE(r.output.find(png), std::string::npos) << r.output;
  }
  std::ifstream script(out / "plot.gp");
  const std::string text((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("data/small_batch.eval.dat"), std::string::npos);
  EXPECT_NE(text.find("data/large_batch.eval.dat"), std::string::npos);
}

// A run stopped before its first evaluation has only training rows: the
// loss charts are drawn, the accuracy charts left out.
TEST(PlotCli, ARunWithoutEvaluationGetsItsLossCharts) {
  const auto run = fs::path(paratrain::testing::temp_dir("cli-plot")) / "no_eval";
  fs::create_directories(run);
  std::ofstream(run / "metrics.jsonl") << R"({"kind":"train","epoch":0,"step":10,"samples":640,"loss":2.0})" "\n"
                                       << R"({"kind":"train","epoch":0,"step":20,"samples":1280,"loss":1.5})" "\n";
  const auto out = run / "charts";
  auto r = run_cli({"plot", run.string(), "-o", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(is_png(out / "loss_vs_samples.png")) << r.output;
  EXPECT_FALSE(fs::exists(out / "accuracy_vs_epoch.png"));
}

TEST(PlotCli, AFolderWithoutMetricsIsNamed) {
  const auto empty = fs::path(paratrain::testing::temp_dir("cli-plot")) / "not_a_run";
  fs::create_directories(empty);
  auto r = run_cli({"plot", empty.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not_a_run/metrics.jsonl"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run directory"), std::string::npos) << r.output;
}

}  // namespace

// profile.* through the Trainer at 2 ranks (threads): what the rank files
// hold (operators inside the forward and backward phases, the gradient
// all-reduce with its exact bytes, data phases), the summary's parts,
// exposed communication with and without DDP, a straggler on purpose named
// with its delay, and that profiling changes nothing in training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/core/error.h"
#include "paratrain/core/phase.h"
#include "paratrain/profile/chrome_trace.h"
#include "paratrain/profile/rank_profile.h"
#include "paratrain/profile/summary.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace pp = paratrain::profile;
namespace pt = paratrain::train;
using paratrain::testing::run_ranks;

namespace {

// An MLP 64-32-10 on synthetic 8x8 images, 16 per rank: 8 steps an epoch at 2 ranks.
pt::TrainConfig small_run(const std::string& name, const std::string& steps) {
  pt::TrainConfig c;
  c.run.name = name;
  c.run.output_dir = paratrain::testing::temp_dir("profile");
  c.run.seed = 5;
  c.run.log_every = 0;
  c.model.hidden = {32};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 256;
  c.data.synthetic_test_size = 32;
  c.data.synthetic_image_size = 8;
  c.data.batch_size = 16;
  c.train.epochs = 1;
  c.train.eval_every_epochs = 0;
  c.profile.steps = steps;
  return c;
}

struct TrainedRun {
  std::filesystem::path dir;
  int64_t parameter_bytes = 0;
  std::vector<at::Tensor> parameters;  // rank 0's, in full
};

TrainedRun train(const pt::TrainConfig& c, int ranks = 2) {
  TrainedRun out;
  run_ranks(ranks, [&](paratrain::comm::ProcessGroup& g) {
    pt::Trainer t(c, g);
    t.fit();
    auto full = t.full_parameters();
    if (g.rank() == 0) {
      out.dir = t.run_dir();
      for (auto& [name, p] : full) {
        out.parameter_bytes += p.numel() * static_cast<int64_t>(p.element_size());
        out.parameters.push_back(p.clone());
      }
    }
  });
  return out;
}

bool inside(const pp::OpEvent& e, const pp::OpEvent& phase) {
  return e.thread == phase.thread && e.start_us >= phase.start_us && e.start_us + e.dur_us <= phase.start_us + phase.dur_us;
}

// Operators of the loop's thread that lie inside a phase named `name` in step `s`.
int ops_in_phase(const pp::RankProfile& p, const pp::StepSpan& s, const char* name) {
  int count = 0;
  for (const auto& phase : p.events) {
    if (!phase.user_scope || phase.name != name || phase.start_us < s.start_us || phase.start_us >= s.end_us) continue;
    for (const auto& e : p.events)
      if (!e.user_scope && e.name.rfind("aten::", 0) == 0 && inside(e, phase)) ++count;
  }
  return count;
}

}  // namespace

TEST(ProfileTrainer, RankFilesHoldPhasesOperatorsAndTheGradientAllReduce) {
  const TrainedRun run = train(small_run("ddp", "3-4"));
  const auto profiles = pp::read_run_profiles(run.dir);
  ASSERT_EQ(profiles.size(), 2u);
  for (const auto& p : profiles) {
    SCOPED_TRACE("rank " + std::to_string(p.rank));
    EXPECT_FALSE(p.profiler.empty());
    EXPECT_EQ(p.collectives_source, "flight recorder");
    ASSERT_EQ(p.steps.size(), 2u);
    EXPECT_EQ(p.steps[0].step, 3);
    EXPECT_EQ(p.steps[1].step, 4);
    for (const auto& s : p.steps) {
      EXPECT_GT(ops_in_phase(p, s, paratrain::kPhaseForward), 0);
      EXPECT_GT(ops_in_phase(p, s, paratrain::kPhaseBackward), 0);
      EXPECT_GT(ops_in_phase(p, s, paratrain::kPhaseOptimizer), 0);
      const bool data = std::any_of(p.events.begin(), p.events.end(), [&](const pp::OpEvent& e) {
        return e.user_scope && e.name == paratrain::kPhaseData && e.start_us >= s.start_us && e.start_us < s.end_us;
      });
      EXPECT_TRUE(data);
      // DDP's buckets hold every gradient once: the step's all-reduces carry
      // exactly the parameters' bytes.
      int64_t bytes = 0;
      for (const auto& c : p.collectives)
        if (c.op == "all_reduce" && c.start_us >= s.start_us && c.end_us <= s.end_us) bytes += c.bytes;
      EXPECT_EQ(bytes, run.parameter_bytes);
    }
  }
  const nlohmann::json trace = pp::chrome_trace(profiles);
  EXPECT_EQ(pp::trace_event_format_problem(trace), "");
  std::set<int> pids_with_ops;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == "op") pids_with_ops.insert(e["pid"].get<int>());
  EXPECT_EQ(pids_with_ops, (std::set<int>{0, 1}));
}

TEST(ProfileTrainer, PartsAddUpAndDdpExposesCommunicationThatNoDdpDoesNot) {
  const auto ddp = pp::summarize(pp::read_run_profiles(train(small_run("ddp", "2-5")).dir));
  // ddp.mode = "none" is one process on the whole batch (more ranks are refused).
  auto no_comm_config = small_run("none", "2-5");
  no_comm_config.ddp.mode = "none";
  no_comm_config.data.batch_size = 32;
  const auto none = pp::summarize(pp::read_run_profiles(train(no_comm_config, 1).dir));
  ASSERT_EQ(ddp.steps.size(), 8u);
  ASSERT_EQ(none.steps.size(), 4u);
  double exposed = 0;
  for (const auto& b : ddp.steps) {
    const double parts = b.data_ms + b.compute_ms + b.optimizer_ms + b.exposed_comm_ms + b.idle_ms;
    EXPECT_NEAR(parts, b.wall_ms, 0.05 * b.wall_ms) << "step " << b.step << " rank " << b.rank;
    EXPECT_GT(b.compute_ms, 0);
    EXPECT_GT(b.collectives, 0);
    exposed += b.exposed_comm_ms;
  }
  EXPECT_GT(exposed, 0);
  for (const auto& b : none.steps) {
    EXPECT_EQ(b.collectives, 0) << "step " << b.step;
    EXPECT_EQ(b.exposed_comm_ms, 0) << "step " << b.step;
  }
}

TEST(ProfileTrainer, AStragglerOnPurposeIsNamedWithItsDelay) {
  auto c = small_run("slow", "3-5");
  c.profile.test_slow_rank = 1;
  c.profile.test_slow_ms = 100;
  const auto s = pp::summarize(pp::read_run_profiles(train(c).dir));
  ASSERT_EQ(s.stragglers.size(), 3u);
  for (const auto& st : s.stragglers) {
    EXPECT_EQ(st.rank, 1) << "step " << st.step;
    EXPECT_EQ(st.waiting_rank, 0);
    EXPECT_NEAR(st.waited_ms, 100.0, 20.0) << "step " << st.step;  // the delay within 20%
  }
}

TEST(ProfileTrainer, ProfilingChangesNothingInTraining) {
  const TrainedRun plain = train(small_run("plain", ""));
  auto profiled_config = small_run("profiled", "2-4");
  profiled_config.profile.record_shapes = true;
  profiled_config.profile.memory = true;
  const TrainedRun profiled = train(profiled_config);
  EXPECT_FALSE(std::filesystem::exists(pp::profile_dir(plain.dir)));
  ASSERT_EQ(plain.parameters.size(), profiled.parameters.size());
  for (size_t i = 0; i < plain.parameters.size(); ++i) EXPECT_TRUE(at::equal(plain.parameters[i], profiled.parameters[i]));
  // The checkpoints' tensors (model and optimizer state, every rank's file)
  // are bitwise equal; only the saved config differs.
  for (const char* file : {"rank_0.safetensors", "rank_1.safetensors"}) {
    const auto a = paratrain::checkpoint::read_safetensors(plain.dir / "checkpoints" / "step_00000008" / file);
    const auto b = paratrain::checkpoint::read_safetensors(profiled.dir / "checkpoints" / "step_00000008" / file);
    ASSERT_EQ(a.tensors.size(), b.tensors.size()) << file;
    for (const auto& [name, t] : a.tensors) EXPECT_TRUE(at::equal(t, b.tensors.at(name))) << file << " " << name;
  }
  // Shapes and memory were recorded.
  const auto p = pp::read_run_profiles(profiled.dir)[0];
  EXPECT_TRUE(std::any_of(p.events.begin(), p.events.end(), [](const pp::OpEvent& e) { return !e.shapes.empty(); }));
  EXPECT_TRUE(std::any_of(p.events.begin(), p.events.end(), [](const pp::OpEvent& e) { return e.name == "[memory]"; }));
}

TEST(ProfileTrainer, OnlyTheChosenRanksRecord) {
  auto c = small_run("rank1", "2");
  c.profile.ranks = {1};
  const auto profiles = pp::read_run_profiles(train(c).dir);
  ASSERT_EQ(profiles.size(), 1u);
  EXPECT_EQ(profiles[0].rank, 1);
  ASSERT_EQ(profiles[0].steps.size(), 1u);
  EXPECT_GT(profiles[0].overhead.unprofiled_steps, 0);  // step 1 ran unprofiled before it
}

TEST(ProfileConfig, StepRangesRanksAndTheirErrors) {
  auto c = small_run("cfg", "");
  pt::apply_override(c, "profile.steps=10-12");
  EXPECT_EQ(pt::profile_step_range(c.profile), std::make_pair(int64_t{10}, int64_t{12}));
  pt::apply_override(c, "profile.steps=7");
  EXPECT_EQ(pt::profile_step_range(c.profile), std::make_pair(int64_t{7}, int64_t{7}));
  pt::apply_override(c, "profile.ranks=[0,3]");
  EXPECT_EQ(c.profile.ranks, (std::vector<int64_t>{0, 3}));
  pt::apply_override(c, "profile.ranks=all");
  EXPECT_TRUE(c.profile.ranks.empty());
  for (const char* bad : {"profile.steps=12-10", "profile.steps=0", "profile.steps=a-b", "profile.steps=3-"})
    EXPECT_THROW(pt::apply_override(c, bad), paratrain::ConfigError) << bad;
  const auto from_file = pt::config_from_toml_string("[profile]\nsteps = \"3-4\"\nranks = \"all\"\n");
  EXPECT_TRUE(from_file.profile.ranks.empty());
  EXPECT_EQ(pt::config_from_toml_string(pt::to_toml(from_file)), from_file);
  auto lone = small_run("cfg", "");
  lone.profile.test_slow_ms = 5;
  EXPECT_THROW(pt::validate_config(lone), paratrain::ConfigError);
  auto too_many = small_run("too_many", "2");
  too_many.profile.ranks = {5};
  EXPECT_THROW(train(too_many), paratrain::ConfigError);
}

// Where kineto cannot start, the legacy profiler gives the same file; forced
// here with PARATRAIN_PROFILER=legacy (this process only: each test runs alone).
TEST(ProfileTrainer, TheLegacyProfilerWritesTheSameKindOfFile) {
  ::setenv("PARATRAIN_PROFILER", "legacy", 1);
  const TrainedRun run = train(small_run("legacy", "3"));
  ::unsetenv("PARATRAIN_PROFILER");
  for (const auto& p : pp::read_run_profiles(run.dir)) {
    EXPECT_EQ(p.profiler, "legacy");
    ASSERT_EQ(p.steps.size(), 1u);
    EXPECT_GT(ops_in_phase(p, p.steps[0], paratrain::kPhaseForward), 0);
    EXPECT_GT(ops_in_phase(p, p.steps[0], paratrain::kPhaseBackward), 0);
  }
}

TEST(ProfileTrainer, KinetoIsTheDefault) {
  const TrainedRun run = train(small_run("kineto", "3"), 1);
  EXPECT_EQ(pp::read_run_profiles(run.dir)[0].profiler, "kineto");
}

// A teacher sharded over the data-parallel ranks (a ZeRO-3 student's) is
// built as a skeleton and each rank reads only its pieces from the
// checkpoint (Note [Skeleton models]): no rank holds the teacher whole, and
// its logits are those of the whole teacher. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "paratrain/core/memory_meter.h"
#include "paratrain/train/distill/teacher.h"
#include "paratrain/train/trainer.h"
#include "tests/support/gpt_run.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::train::Teacher;
using paratrain::train::TeacherPlacement;
using paratrain::train::TeacherSource;

int64_t parameter_bytes(const std::vector<std::pair<std::string, at::Tensor>>& params) {
  int64_t bytes = 0;
  for (const auto& [name, t] : params) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// A GPT teacher of 12 blocks (each about 1/13 of it), saved after 2 steps,
// read by 4 ranks. Read whole, the ranks would hold 4 teachers at once
// (FSDP's first act compares them across ranks); as a skeleton each holds
// its quarter and, while building, one layer or one unit more. Measured over
// the 4 rank threads together with the process's allocator meter: under 2
// teachers (1.14 measured), where reading whole holds at least 4.
TEST(ShardedTeacher, NoRankHoldsTheTeacherWholeAndItsLogitsAreTheWholeTeachers) {
  const std::string dir = paratrain::testing::temp_dir("sharded_teacher");
  const auto corpus = paratrain::testing::write_word_corpus(dir, 9);
  auto config = paratrain::testing::tiny_gpt_config(dir, corpus);
  config.run.name = "teacher";
  config.model.layers = 12;
  config.model.d_model = 64;
  config.train.max_steps = 2;
  const auto trained = paratrain::testing::run_training(config, 1);
  const int64_t teacher_bytes = parameter_bytes(trained.params);
  const TeacherSource source =
      paratrain::train::find_teacher((std::filesystem::path(dir) / "teacher").string(), config);

  const at::Tensor tokens = at::randint(0, 256, {3, 16}, at::TensorOptions().dtype(at::kLong));
  at::Tensor whole;
  {
    TeacherPlacement replicated;
    Teacher teacher(source, replicated);
    whole = teacher.logits(tokens);
  }

  paratrain::core::install_memory_meter();
  std::atomic<int> built{0};
  std::vector<at::Tensor> sharded_logits(4);
  int64_t build_peak = 0;
  paratrain::testing::run_ranks(4, [&](paratrain::comm::ProcessGroup& g) {
    g.barrier()->wait(std::chrono::seconds(60));
    if (g.rank() == 0) paratrain::core::begin_memory_window();
    g.barrier()->wait(std::chrono::seconds(60));
    TeacherPlacement placement;
    placement.shard = true;
    placement.dp = &g;
    placement.timeout = std::chrono::seconds(60);
    Teacher teacher(source, placement);
    ++built;
    g.barrier()->wait(std::chrono::seconds(60));
    if (g.rank() == 0) {
      const auto reading = paratrain::core::memory_meter();
      build_peak = reading.peak_bytes - reading.baseline_bytes;
    }
    EXPECT_TRUE(teacher.sharded());
    EXPECT_EQ(teacher.parameter_count() * 4, teacher_bytes);
    sharded_logits[g.rank()] = teacher.logits(tokens);
  });
  ASSERT_EQ(built.load(), 4);
  std::printf("sharded GPT teacher (%lld bytes) built by 4 ranks: peak %lld bytes = %.2f teachers\n",
              static_cast<long long>(teacher_bytes), static_cast<long long>(build_peak),
              static_cast<double>(build_peak) / static_cast<double>(teacher_bytes));
  EXPECT_LT(build_peak, 2 * teacher_bytes) << "a rank held the teacher whole";
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(torch::equal(sharded_logits[r], whole)) << "rank " << r;
}

}  // namespace

// A tied tensor across pipeline stages (pipeline/tied.h): the GPT's wte,
// used by the embedding on stage 0 and by the LM head on the last stage. Each
// stage's copy holds only its part of the gradient; after the sum over the
// embedding group both equal the single-process gradient. The negative
// control of the GPT pipeline oracle (tests/text_gpt/gpt_pipeline_trainer_test):
// without the sum each copy misses by far. Ranks are threads.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "paratrain/models/gpt.h"
#include "paratrain/models/mlp.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/pipeline/tied.h"
#include "paratrain/topology/device_mesh.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace {

namespace pl = paratrain::pipeline;
using paratrain::models::GptOptions;

const GptOptions kGpt{.vocab = 256, .seq_len = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.0};

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

struct Batch {
  at::Tensor tokens, targets;
};
Batch make_batch() {
  auto gen = at::detail::createCPUGenerator(7);
  auto ids = at::randint(0, 256, {8, 17}, gen, at::TensorOptions().dtype(at::kLong));
  return {ids.narrow(1, 0, 16).contiguous(), ids.narrow(1, 1, 16).contiguous()};
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(TiedParameters, FoundOnlyWhereStagesShareATensor) {
  auto gpt = paratrain::testing::seeded(1, [] { return paratrain::models::make_gpt(kGpt); });
  // embed | blocks.0, blocks.1 | head: wte is on stages 0 and 2.
  const auto tied = pl::find_tied_parameters(gpt->layers(), {0, 1, 3, 4}, 3);
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_EQ(tied[0].name, "wte.weight");
  EXPECT_EQ(tied[0].stages, (std::vector<int>{0, 2}));
  // Interleaved, 2 stages x 2 chunks: embed on stage 0, head on stage 1.
  EXPECT_EQ(pl::find_tied_parameters(gpt->layers(), {0, 1, 2, 3, 4}, 2)[0].stages, (std::vector<int>{0, 1}));
  auto mlp = paratrain::models::make_mlp({.in_features = 4, .hidden = {4}, .out_features = 2});
  EXPECT_TRUE(pl::find_tied_parameters(mlp->layers(), {0, 1, 2}, 2).empty());
}

TEST(TiedParameters, CopiesSumToTheSingleProcessGradientAndMissWithoutTheSum) {
  const Batch batch = make_batch();
  auto single = paratrain::testing::seeded(1, [] { return paratrain::models::make_gpt(kGpt); });
  lm_loss(single->forward(batch.tokens), batch.targets).backward();
  const at::Tensor expected = single->named_parameters()["wte.weight"].grad();

  std::vector<at::Tensor> before(2), after(2);
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& world) {
    paratrain::topology::DeviceMesh mesh(world, {.dp = 1, .tp = 1, .pp = 2, .cp = 1});
    auto gpt = paratrain::testing::seeded(1, [] { return paratrain::models::make_gpt(kGpt); });
    const auto layers = gpt->layers();
    const std::vector<int> bounds{0, 2, 4};  // embed, blocks.0 | blocks.1, head
    const auto shapes = pl::infer_boundary_shapes(layers, {16}, at::kLong);
    const int s = mesh.rank(paratrain::topology::Axis::kPp);
    pl::LocalChunk c;
    c.module = std::make_shared<pl::StageModule>(
        std::vector<paratrain::models::Layer>(layers.begin() + bounds[s], layers.begin() + bounds[s + 1]));
    c.model_chunk = s;
    c.input_shape = shapes.shapes[bounds[s]];
    c.input_dtype = shapes.dtypes[bounds[s]];
    c.output_shape = shapes.shapes[bounds[s + 1]];
    pl::TiedGradients tied(mesh, pl::find_tied_parameters(layers, bounds, 2), *c.module, std::chrono::seconds(60));
    EXPECT_EQ(tied.is_copy("wte.weight"), s == 1);  // the last stage holds the copy
    pl::ExecutorOptions options;
    options.schedule = pl::ScheduleKind::kOneFOneB;
    options.shape = {2, 4, 1};
    pl::Executor executor(mesh.group(paratrain::topology::Axis::kPp), {c}, options);
    executor.train_step(batch.tokens, batch.targets, lm_loss, {}, nullptr, 0);
    const at::Tensor w = c.module->named_parameters()["wte.weight"];
    before[s] = w.grad().clone();
    tied.all_reduce_gradients();
    after[s] = w.grad().clone();
  });
  for (int s = 0; s < 2; ++s) {
    std::printf("[ measured ] stage %d: wte.weight gradient vs 1 process: %.3g without the sum, %.3g with it\n", s,
                rel(before[s], expected), rel(after[s], expected));
    // The input lookup's part (stage 0) touches only the batch's tokens; the
    // head's (last stage) is most of the gradient: each alone is far off.
    EXPECT_GT(rel(before[s], expected), 1e-2) << "stage " << s;
    // Micro-batch sums in another order than one batch: float32 rounding.
    EXPECT_LT(rel(after[s], expected), 1e-5) << "stage " << s;
  }
  EXPECT_TRUE(torch::equal(after[0], after[1]));
}

}  // namespace

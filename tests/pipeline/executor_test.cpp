// The executor below the Trainer: the schedules' own accounting of live
// micro-batches (1F1B keeps at most p on stage 0, GPipe all m), what
// activation checkpointing saves, and the timeline it records. Ranks are
// threads; the model is a small MLP cut into stages by hand.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>


#include "paratrain/models/mlp.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/stage.h"
#include "tests/support/multi_rank.h"
#include "tests/support/seeded.h"

namespace {

namespace pl = paratrain::pipeline;

struct RunResult {
  std::vector<pl::StepReport> reports;        // per rank
  std::vector<std::vector<pl::TimelineEvent>> events;  // per rank
};

// One training step of an 8-layer MLP cut into p * v equal chunks.
RunResult run(int p, pl::ScheduleKind kind, int m, int v, bool recompute) {
  RunResult out;
  out.reports.resize(p);
  out.events.resize(p);
  paratrain::testing::run_ranks(p, [&](paratrain::comm::ProcessGroup& pp) {
    auto model = paratrain::testing::seeded(3, [] {
      return paratrain::models::make_mlp({.in_features = 12, .hidden = {16, 16, 16, 16, 16, 16, 16}, .out_features = 4});
    });
    const auto layers = model->layers();
    const auto shapes = pl::infer_boundary_shapes(layers, {12});
    const int chunks = p * v;
    std::vector<pl::LocalChunk> local;
    for (int i = 0; i < v; ++i) {
      const int mc = i * p + pp.rank();
      const int first = mc * 8 / chunks, last = (mc + 1) * 8 / chunks;
      pl::LocalChunk c;
      c.module = std::make_shared<pl::StageModule>(
          std::vector<paratrain::models::Layer>(layers.begin() + first, layers.begin() + last));
      c.model_chunk = mc;
      c.input_shape = shapes.shapes[first];
      c.output_shape = shapes.shapes[last];
      local.push_back(c);
    }
    pl::ExecutorOptions options;
    options.schedule = kind;
    options.shape = {p, m, v};
    options.checkpoint_activations = recompute;
    pl::Executor executor(pp, local, options);
    pl::Timeline timeline(pp.rank(), {});
    // A generator of its own: the ranks are threads, and two threads drawing
    // from the global one would each get part of the other's stream.
    auto gen = at::detail::createCPUGenerator(4);
    auto x = at::randn({8 * m, 12}, gen);
    auto y = at::randint(0, 4, {8 * m}, gen, at::TensorOptions().dtype(at::kLong));
    auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
    out.reports[pp.rank()] = executor.train_step(x, y, loss, {}, &timeline, 0);
    out.events[pp.rank()] = timeline.events();
  });
  return out;
}

TEST(PipelineExecutor, OneFOneBKeepsAtMostPMicrobatchesAliveGpipeKeepsM) {
  for (int p : {2, 4}) {
    for (int m : {1, p, 2 * p + 1}) {
      const auto one = run(p, pl::ScheduleKind::kOneFOneB, m, 1, false);
      const auto gpipe = run(p, pl::ScheduleKind::kGpipe, m, 1, false);
      EXPECT_EQ(one.reports[0].peak_in_flight, std::min(p, m)) << "p " << p << " m " << m;
      EXPECT_EQ(gpipe.reports[0].peak_in_flight, m) << "p " << p << " m " << m;
      for (int s = 0; s < p; ++s) EXPECT_LE(one.reports[s].peak_in_flight, p - s) << "stage " << s;
      // Same micro-batch sizes: the live bytes scale with the live count.
      if (m > p) EXPECT_LT(one.reports[0].peak_activation_bytes, gpipe.reports[0].peak_activation_bytes);
    }
  }
}

TEST(PipelineExecutor, ActivationCheckpointingKeepsOnlyChunkInputsAndRecomputes) {
  const auto plain = run(2, pl::ScheduleKind::kGpipe, 4, 1, false);
  const auto recompute = run(2, pl::ScheduleKind::kGpipe, 4, 1, true);
  // Stage 0 holds 4 micro-batches of 8 rows either way: without
  // recomputation the outputs of its 4 layers (3 x 16 + 16 features), with
  // it only its 12-feature input.
  EXPECT_EQ(plain.reports[0].peak_activation_bytes, 4 * 8 * (16 * 4) * 4);
  EXPECT_EQ(recompute.reports[0].peak_activation_bytes, 4 * 8 * 12 * 4);
  auto count = [](const std::vector<pl::TimelineEvent>& events, pl::EventKind kind) {
    return std::count_if(events.begin(), events.end(), [kind](const auto& e) { return e.kind == kind; });
  };
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(count(recompute.events[s], pl::EventKind::kRecompute), 4);
    EXPECT_EQ(count(plain.events[s], pl::EventKind::kRecompute), 0);
    EXPECT_EQ(count(plain.events[s], pl::EventKind::kForward), 4);
    EXPECT_EQ(count(plain.events[s], pl::EventKind::kBackward), 4);
  }
  // Stage 1 waits for stage 0's activations; stage 0 for stage 1's gradients.
  EXPECT_EQ(count(plain.events[1], pl::EventKind::kRecv), 4);
  EXPECT_EQ(count(plain.events[0], pl::EventKind::kRecv), 4);
  // The loss is only on the last stage.
  EXPECT_FALSE(plain.reports[0].loss.defined());
  ASSERT_TRUE(plain.reports[1].loss.defined());
  EXPECT_TRUE(torch::equal(plain.reports[1].loss, recompute.reports[1].loss));
}

}  // namespace

// models::ParallelGpt against the single-process GPT it is loaded from, one
// forward and backward, without the Trainer: logits (gathered over tp and
// cp) and every parameter's gradient (gathered over tp, averaged over cp as
// the megatron strategy's DDP does, Megatron-SP's replicated gradients summed
// over tp) equal the GPT's, at tp 2 and 4, cp 2, tp 2 + SP and tp 2 x cp 2 +
// SP. Negative control: under SP, skipping the tp sum of the LayerNorm and
// row-parallel bias gradients misses by far.
// Tolerance: 1e-5 of each tensor's largest magnitude: the same float32 sums
// in another order (split matmuls, ring attention's online softmax, the
// vocab-parallel softmax denominator).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <mutex>

#include "paratrain/models/gpt.h"
#include "paratrain/models/parallel_gpt.h"
#include "paratrain/sequence_parallel/megatron_sp.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/topology/device_mesh.h"
#include "tests/support/multi_rank.h"

namespace paratrain::models {
namespace {

namespace F = torch::nn::functional;
namespace tpl = tensor_parallel;
using topology::Axis;

constexpr double kTolerance = 1e-5;
const GptOptions kGpt{.vocab = 256, .seq_len = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.0};

double rel_diff(const at::Tensor& got, const at::Tensor& want) {
  const double scale = std::max(want.abs().max().item<double>(), 1e-12);
  return (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>() / scale;
}

struct Reference {
  std::shared_ptr<Model> gpt;
  at::Tensor tokens, targets, logits;
  torch::OrderedDict<std::string, at::Tensor> grads;
};

Reference reference() {
  Reference r;
  torch::manual_seed(11);
  r.gpt = make_gpt(kGpt);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  r.tokens = at::randint(0, kGpt.vocab, {3, kGpt.seq_len}, gen, at::TensorOptions().dtype(at::kLong));
  r.targets = at::randint(0, kGpt.vocab, {3, kGpt.seq_len}, gen, at::TensorOptions().dtype(at::kLong));
  r.logits = r.gpt->forward(r.tokens);
  F::cross_entropy(r.logits.reshape({-1, kGpt.vocab}), r.targets.reshape({-1})).backward();
  r.logits = r.logits.detach();
  for (const auto& p : r.gpt->named_parameters()) r.grads.insert(p.key(), p.value().grad().clone());
  return r;
}

struct Worst {
  double logits = 0, grads = 0;
  std::string worst_grad;
};

// One forward and backward at (tp, cp, sp); returns the worst differences.
Worst run_layout(const Reference& ref, int tp, int cp, bool sp, bool sum_sp_grads = true) {
  Worst worst;
  std::mutex mu;
  paratrain::testing::run_ranks(tp * cp, [&](comm::ProcessGroup& world) {
    topology::DeviceMesh mesh(world, topology::ParallelDims{.dp = 1, .tp = tp, .pp = 1, .cp = cp});
    comm::ProcessGroup& tp_group = mesh.group(Axis::kTp);
    comm::ProcessGroup& cp_group = mesh.group(Axis::kCp);
    const tpl::TpContext ctx{&tp_group, std::chrono::seconds(60)};
    ParallelGpt model(ParallelGptOptions{.gpt = kGpt, .tp = ctx, .cp = &cp_group, .megatron_sp = sp, .seed = 0});
    tpl::load_full_parameters(model, ref.gpt->named_parameters(), ctx);

    const at::Tensor logits =
        model.forward(sequence_parallel::sequence_chunk(ref.tokens, 1, cp_group));
    const at::Tensor targets = sequence_parallel::sequence_chunk(ref.targets, 1, cp_group);
    tpl::vocab_parallel_cross_entropy(logits, targets.contiguous(), ctx).backward();
    // As the strategy: average over the cp replicas (each rank's loss is its
    // chunk's mean), sum the sequence-parallel partial gradients over tp.
    for (auto& p : model.parameters()) {
      at::Tensor g = p.grad();
      cp_group.all_reduce(g, comm::ReduceOp::kSum)->wait();
      g.div_(cp);
    }
    if (sp && sum_sp_grads) {
      sequence_parallel::sync_sequence_parallel_grads(model.sequence_parallel_params(), {.group = &tp_group});
    }

    // Full logits: vocabulary over tp, sequence chunks over cp.
    at::Tensor full = tpl::all_gather_last_dim(logits.detach().contiguous(), ctx);
    at::Tensor stacked = at::empty({cp, full.size(0), full.size(1), full.size(2)});
    cp_group.all_gather(stacked, full.contiguous())->wait();
    full = stacked.permute({1, 0, 2, 3}).reshape(ref.logits.sizes());
    const double logit_diff = rel_diff(full, ref.logits);

    const auto grads = tpl::gather_full_parameters(model, ctx, tpl::Gather::kGradients);
    double grad_diff = 0;
    std::string name;
    for (const auto& item : ref.grads) {
      const double d = rel_diff(grads[item.key()], item.value());
      if (d > grad_diff) grad_diff = d, name = item.key();
    }
    std::lock_guard<std::mutex> lock(mu);
    worst.logits = std::max(worst.logits, logit_diff);
    if (grad_diff > worst.grads) worst.grads = grad_diff, worst.worst_grad = name;
  });
  std::printf("[ tp %d cp %d%s%s ] logits %.3g, gradients %.3g (%s)\n", tp, cp, sp ? " + megatron_sp" : "",
              sum_sp_grads ? "" : ", tp sum skipped", worst.logits, worst.grads, worst.worst_grad.c_str());
  return worst;
}

struct Layout {
  int tp, cp;
  bool sp;
};

class ParallelGptLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(ParallelGptLayouts, LogitsAndGradientsEqualTheSingleProcessGpt) {
  const Reference ref = reference();
  const Worst w = run_layout(ref, GetParam().tp, GetParam().cp, GetParam().sp);
  EXPECT_LE(w.logits, kTolerance);
  EXPECT_LE(w.grads, kTolerance) << w.worst_grad;
}

INSTANTIATE_TEST_SUITE_P(Megatron, ParallelGptLayouts,
                         ::testing::Values(Layout{2, 1, false}, Layout{4, 1, false}, Layout{1, 2, false},
                                           Layout{2, 1, true}, Layout{2, 2, true}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + "_cp" + std::to_string(info.param.cp) +
                                  (info.param.sp ? "_sp" : "");
                         });

TEST(ParallelGptNegativeControl, SkippingTheSequenceParallelGradientSumMissesByFar) {
  const Reference ref = reference();
  const Worst w = run_layout(ref, 2, 1, true, /*sum_sp_grads=*/false);
  EXPECT_LE(w.logits, kTolerance);  // the forward is unaffected
  EXPECT_GT(w.grads, 100 * kTolerance);
}

TEST(ParallelGpt, RefusesHeadsThatDoNotSplitOverTp) {
  paratrain::testing::run_ranks(2, [&](comm::ProcessGroup& world) {
    const tpl::TpContext ctx{&world, std::chrono::seconds(30)};
    GptOptions options = kGpt;
    options.heads = 2;  // one head per rank: fine
    EXPECT_NO_THROW(ParallelGpt(ParallelGptOptions{.gpt = options, .tp = ctx}));
    options.heads = 1;  // half a head per rank
    EXPECT_ANY_THROW(ParallelGpt(ParallelGptOptions{.gpt = options, .tp = ctx}));
  });
}

}  // namespace
}  // namespace paratrain::models

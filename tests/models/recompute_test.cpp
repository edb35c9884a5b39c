// Activation checkpointing (models/recompute.h): gradients bitwise equal to
// the plain forward with dropout on, the random stream left as without
// recomputation, each parameter's accumulator reached once, the segments a
// policy makes, and what is refused.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <map>

#include "paratrain/core/autocast.h"
#include "paratrain/core/error.h"
#include "paratrain/core/loss_weight.h"
#include "paratrain/models/cnn.h"
#include "paratrain/models/gpt.h"
#include "paratrain/models/mlp.h"
#include "paratrain/models/recompute.h"
#include "paratrain/moe/moe.h"

namespace pm = paratrain::models;

namespace {

// Dropout inside and between layers, so a recompute that drew other random
// numbers would give other gradients.
std::shared_ptr<pm::Model> small_gpt() {
  torch::manual_seed(3);
  return pm::make_gpt({.vocab = 32, .seq_len = 8, .layers = 3, .d_model = 16, .heads = 2, .dropout = 0.2});
}

at::Tensor tokens() {
  torch::manual_seed(11);
  return torch::randint(0, 32, {4, 8}, torch::kLong);
}

struct Outcome {
  std::map<std::string, at::Tensor> grads;
  at::Tensor next_draw;  // the random stream after the step
};

Outcome step(pm::Model& model, const at::Tensor& x) {
  torch::manual_seed(5);
  at::Tensor logits = model.forward(x);
  torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), x.reshape({-1})).backward();
  Outcome out;
  for (const auto& p : model.named_parameters()) out.grads[p.key()] = p.value().grad().clone();
  out.next_draw = torch::rand({4});
  model.zero_grad();
  return out;
}

void expect_bitwise(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    ASSERT_TRUE(b.grads.count(name)) << name;
    EXPECT_TRUE(torch::equal(g, b.grads.at(name))) << name << " differs by "
                                                   << (g - b.grads.at(name)).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(a.next_draw, b.next_draw)) << "the random stream moved differently";
}

}  // namespace

TEST(Recompute, SegmentsOfEachPolicy) {
  const std::vector<std::string> gpt{"embed", "blocks.0", "blocks.1", "blocks.2", "head"};
  EXPECT_EQ(pm::recompute_segments(gpt, {}), std::vector<int>({-1, -1, -1, -1, -1}));
  EXPECT_EQ(pm::recompute_segments(gpt, {.mode = pm::RecomputeMode::kBlocks}), std::vector<int>({0, 1, 2, 3, -1}));
  EXPECT_EQ(pm::recompute_segments(gpt, {.mode = pm::RecomputeMode::kEveryK, .every_k = 2}),
            std::vector<int>({0, 0, 1, 1, -1}));
  EXPECT_EQ(pm::recompute_segments(gpt, {.mode = pm::RecomputeMode::kEveryK, .every_k = 2, .layers = {"blocks.*"}}),
            std::vector<int>({-1, 0, 0, 1, -1}));
  EXPECT_EQ(pm::recompute_segments(gpt, {.mode = pm::RecomputeMode::kBlocks, .layers = {"blocks.[02]", "head"}}),
            std::vector<int>({-1, 0, -1, 1, 2}));
  // An unchosen layer ends a run.
  EXPECT_EQ(pm::recompute_segments(gpt, {.mode = pm::RecomputeMode::kEveryK, .every_k = 3, .layers = {"embed", "blocks.[12]"}}),
            std::vector<int>({0, -1, 1, 1, -1}));
  try {
    pm::recompute_segments(gpt, {.mode = pm::RecomputeMode::kBlocks, .layers = {"block.*"}});
    FAIL() << "a pattern matching no layer was accepted";
  } catch (const paratrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"block.*\" matches none"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blocks.0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pm::parse_recompute_mode("full"), paratrain::Error);
  EXPECT_EQ(pm::parse_recompute_mode("every_k"), pm::RecomputeMode::kEveryK);
}

TEST(Recompute, GradientsAndRandomStreamEqualThePlainForwardBitwise) {
  const at::Tensor x = tokens();
  auto plain = small_gpt();
  const Outcome reference = step(*plain, x);
  for (const auto& policy : {pm::RecomputePolicy{.mode = pm::RecomputeMode::kBlocks},
                             pm::RecomputePolicy{.mode = pm::RecomputeMode::kEveryK, .every_k = 2},
                             pm::RecomputePolicy{.mode = pm::RecomputeMode::kEveryK, .every_k = 5}}) {
    pm::RecomputedModel model(small_gpt(), policy);
    const int64_t before = pm::recomputed_segments();
    const Outcome got = step(model, x);
    int segments = 0;
    for (int id : model.segments()) segments = std::max(segments, id + 1);
    // The control: the recompute ran, once per segment.
    EXPECT_EQ(pm::recomputed_segments() - before, segments);
    EXPECT_GT(segments, 0);
    expect_bitwise(reference, got);
  }
}

TEST(Recompute, KeepsOnlySegmentInputsAndFreesWhatTheLayersSave) {
  // Without grad history inside a segment, autograd keeps one node per
  // segment: the graph of a recomputed GPT is far smaller.
  const at::Tensor x = tokens();
  auto count_nodes = [](const at::Tensor& out) {
    std::set<torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> todo{out.grad_fn().get()};
    while (!todo.empty()) {
      auto* n = todo.back();
      todo.pop_back();
      if (n == nullptr || !seen.insert(n).second) continue;
      for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
    }
    return seen.size();
  };
  auto plain = small_gpt();
  pm::RecomputedModel model(small_gpt(), {.mode = pm::RecomputeMode::kEveryK, .every_k = 4});
  const size_t plain_nodes = count_nodes(plain->forward(x));
  const size_t recomputed_nodes = count_nodes(model.forward(x));
  EXPECT_LT(recomputed_nodes * 3, plain_nodes) << recomputed_nodes << " nodes vs " << plain_nodes;
}

TEST(Recompute, EachAccumulatorIsReachedOncePerBackward) {
  // DDP's reducer marks a parameter ready from its accumulator's post hook
  // (reducer.cpp): a re-entrant recompute would reach it inside the
  // recompute as well.
  pm::RecomputedModel model(small_gpt(), {.mode = pm::RecomputeMode::kBlocks});
  std::map<std::string, int> fired;
  // The tensor holds its accumulator weakly: keep them, as the reducer does.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (const auto& p : model.named_parameters()) {
    auto acc = torch::autograd::impl::grad_accumulator(p.value());
    ASSERT_TRUE(acc);
    accumulators.push_back(acc);
    const std::string name = p.key();
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [&fired, name](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          ++fired[name];
          return outputs;
        }));
  }
  step(model, tokens());
  EXPECT_EQ(fired.size(), model.named_parameters().size());
  for (const auto& [name, n] : fired) EXPECT_EQ(n, 1) << name;
}

TEST(Recompute, FrozenParametersAndNoGradRunPlainly) {
  torch::manual_seed(1);
  auto mlp = pm::make_mlp({.in_features = 6, .hidden = {5, 4}, .out_features = 3});
  for (auto& p : mlp->named_parameters()) {
    if (p.key().rfind("fc0.", 0) == 0) p.value().requires_grad_(false);
  }
  pm::RecomputedModel model(mlp, {.mode = pm::RecomputeMode::kBlocks});
  const at::Tensor x = torch::randn({2, 6});
  const int64_t before = pm::recomputed_segments();
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(model.forward(x).requires_grad());
  }
  // fc0 frozen and x without gradient: its segment records nothing; fc1's does.
  model.forward(x).sum().backward();
  EXPECT_EQ(pm::recomputed_segments() - before, 1);
  EXPECT_FALSE(mlp->named_parameters()["fc0.weight"].grad().defined());
  EXPECT_TRUE(mlp->named_parameters()["fc1.weight"].grad().defined());
}

TEST(Recompute, AModelWithoutLayersIsRefusedByName) {
  struct Opaque final : pm::Model {
    Opaque() : Model("Opaque") { register_parameter("w", torch::ones({2})); }
    at::Tensor forward(const at::Tensor& x) override { return x * parameters()[0]; }
  };
  try {
    pm::RecomputedModel model(std::make_shared<Opaque>(), {.mode = pm::RecomputeMode::kBlocks});
    FAIL() << "a model without layers was accepted";
  } catch (const paratrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Opaque lists none"), std::string::npos) << e.what();
  }
}

namespace {

// Layers given by hand: each a module and a forward.
struct Listed final : pm::Model {
  explicit Listed(std::vector<pm::Layer> layers) : Model("Listed"), layers_(std::move(layers)) {
    for (auto& l : layers_) {
      for (auto& [name, module] : l.modules) {
        if (named_children().find(name) == nullptr) register_module(name, module);
      }
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = x;
    for (auto& l : layers_) h = l.forward(h);
    return h;
  }
  std::vector<pm::Layer> layers() override { return layers_; }
  std::vector<pm::Layer> layers_;
};

}  // namespace

TEST(Recompute, BatchNormStatisticsMoveOncePerStep) {
  auto cnn = [] {
    torch::manual_seed(4);
    return pm::make_cnn({.in_channels = 1, .image_size = 8, .num_classes = 3, .channels = {4, 6}, .hidden = 5,
                         .batchnorm = true});
  };
  torch::manual_seed(9);
  const at::Tensor x = torch::randn({6, 1, 8, 8});
  auto plain = cnn();
  pm::RecomputedModel model(cnn(), {.mode = pm::RecomputeMode::kBlocks});
  plain->forward(x).sum().backward();
  const int64_t before = pm::recomputed_segments();
  model.forward(x).sum().backward();
  EXPECT_EQ(pm::recomputed_segments() - before, 3);  // conv0, conv1, fc0
  const auto want = plain->named_buffers(), got = model.named_buffers();
  ASSERT_EQ(want.size(), got.size());
  for (const auto& b : want) {
    EXPECT_TRUE(torch::equal(b.value(), got[b.key()])) << b.key();
  }
  EXPECT_EQ(got["bn0.0.num_batches_tracked"].item<int64_t>(), 1);
  for (const auto& p : plain->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().grad(), model.named_parameters()[p.key()].grad())) << p.key();
  }
}

TEST(Recompute, AnInPlaceLayerOnItsOwnIsRefusedByName) {
  torch::manual_seed(2);
  auto fc = torch::nn::Linear(4, 4);
  auto relu = torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true));
  auto out = torch::nn::Linear(4, 2);
  auto model = std::make_shared<Listed>(std::vector<pm::Layer>{
      {"fc", {{"fc", fc.ptr()}}, [fc](const at::Tensor& x) mutable { return fc->forward(x); }},
      {"act", {{"act", relu.ptr()}}, [relu](const at::Tensor& x) mutable { return relu->forward(x); }},
      {"out", {{"out", out.ptr()}}, [out](const at::Tensor& x) mutable { return out->forward(x); }}});
  pm::RecomputedModel blocks(model, {.mode = pm::RecomputeMode::kBlocks});
  try {
    blocks.forward(torch::randn({3, 4}));
    FAIL() << "an in-place layer recomputed from its own input was accepted";
  } catch (const paratrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer act modifies its input in place"), std::string::npos) << e.what();
  }
  // Grouped with the layer before it, the in-place ReLU acts on a value the
  // segment made itself: fine, and equal to the plain model.
  pm::RecomputedModel pairs(model, {.mode = pm::RecomputeMode::kEveryK, .every_k = 2});
  const at::Tensor x = torch::randn({3, 4});
  pairs.forward(x).sum().backward();
  const at::Tensor g = fc->weight.grad().clone();
  fc->weight.grad().zero_();
  model->forward(x).sum().backward();
  EXPECT_TRUE(torch::equal(g, fc->weight.grad()));
}

TEST(Recompute, AWeightSharedWithAPlainLayerKeepsItsGradientUnderBf16Autocast) {
  // A cached bf16 cast made inside the no-grad forward would reach the plain
  // layer without history, and the shared weight would miss its gradient.
  auto run = [](bool recompute) {
    torch::manual_seed(6);
    auto shared = torch::nn::Linear(8, 8);
    auto m = std::make_shared<Listed>(std::vector<pm::Layer>{
        {"a", {{"shared", shared.ptr()}}, [shared](const at::Tensor& x) mutable { return torch::tanh(shared->forward(x)); }},
        {"b", {{"shared", shared.ptr()}}, [shared](const at::Tensor& x) mutable { return shared->forward(x); }}});
    std::shared_ptr<pm::Model> run_model = m;
    if (recompute) run_model = std::make_shared<pm::RecomputedModel>(m, pm::RecomputePolicy{.mode = pm::RecomputeMode::kBlocks, .layers = {"a"}});
    torch::manual_seed(7);
    const at::Tensor x = torch::randn({4, 8});
    {
      paratrain::core::AutocastGuard autocast(at::kBFloat16);
      run_model->forward(x).to(at::kFloat).sum().backward();
    }
    return shared->weight.grad().clone();
  };
  EXPECT_TRUE(torch::equal(run(false), run(true)));
}

// A recomputed MoE layer (Note [Aux losses in backward]): the segment keeps
// the micro-batch's loss weight its forward saw (core/loss_weight.h) and
// opens it again for the recompute, which on a GPU runs on the autograd
// engine's thread; here the scope is simply closed before backward. The
// router's gradient then equals that of the aux loss added to the loss;
// without the kept weight the recompute would inject nothing.
TEST(Recompute, AMoeLayerRecomputedInBackwardStillGetsItsAuxGradient) {
  namespace moe = paratrain::moe;
  const double w = 0.05, f = 0.5;
  auto build = [] {
    torch::manual_seed(11);
    auto layer = std::make_shared<moe::Moe>(moe::MoeOptions{.d_model = 8, .hidden = 16, .experts = 4, .top_k = 2});
    return layer;
  };
  torch::manual_seed(12);
  const at::Tensor x = torch::randn({24, 8});
  auto added = build();
  const at::Tensor task = added->forward(x).square().mean();  // before aux_loss(): it is the forward's
  (f * (task + w * added->aux_loss())).backward();
  auto recomputed = build();
  recomputed->set_aux_loss_weight(w);
  at::Tensor y;
  {
    paratrain::core::LossWeightScope weight(f);
    y = pm::recompute_in_backward([&](const at::Tensor& in) { return recomputed->forward(in); }, x,
                                  pm::SegmentState{.params = recomputed->parameters(), .name = "mlp"});
  }
  (f * y.square().mean()).backward();  // no weight on the thread now
  const at::Tensor a = added->router->weight.grad(), b = recomputed->router->weight.grad();
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-6 * a.abs().max().item<double>());
  EXPECT_EQ(recomputed->take_totals().forwards, 1);  // the recompute's, not the first pass's
}

// The GPT model alone: shapes, parameter names (the tensor-parallel code
// shards by them), causality, the tied LM head, its layers and the GPT-2
// init scale.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "paratrain/models/gpt.h"

namespace paratrain::models {
namespace {

GptOptions tiny() { return {.vocab = 256, .seq_len = 16, .layers = 2, .d_model = 32, .heads = 4, .dropout = 0.0}; }

TEST(Gpt, LogitsHaveOneRowPerPositionAndVocabColumns) {
  torch::manual_seed(0);
  auto model = make_gpt(tiny());
  auto tokens = torch::randint(0, 256, {3, 16}, torch::kLong);
  EXPECT_EQ(model->forward(tokens).sizes(), (std::vector<int64_t>{3, 16, 256}));
  // Shorter contexts than seq_len (generation) and byte tensors (the text
  // dataset's rows) are accepted.
  EXPECT_EQ(model->forward(tokens.slice(1, 0, 5).to(torch::kByte)).sizes(), (std::vector<int64_t>{3, 5, 256}));
  EXPECT_THROW(model->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
  EXPECT_THROW(model->forward(torch::zeros({1, 4}, torch::kFloat)), c10::Error);
}

TEST(Gpt, ParameterNamesAndShapesAreTheDocumentedLayout) {
  auto model = make_gpt(tiny());
  auto params = model->named_parameters();
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"wte.weight", {256, 32}},           {"wpe.weight", {16, 32}},
      {"blocks.1.ln1.weight", {32}},       {"blocks.1.attn.qkv.weight", {96, 32}},
      {"blocks.1.attn.qkv.bias", {96}},    {"blocks.1.attn.proj.weight", {32, 32}},
      {"blocks.1.ln2.bias", {32}},         {"blocks.1.mlp.fc.weight", {128, 32}},
      {"blocks.1.mlp.proj.weight", {32, 128}}, {"ln_f.weight", {32}}};
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(params.contains(name)) << name;
    EXPECT_EQ(params[name].sizes().vec(), shape) << name;
  }
  // 2 embeddings + 2 blocks x 12 + ln_f x 2; no separate head weight.
  EXPECT_EQ(params.size(), 2u + 2 * 12 + 2);
  EXPECT_TRUE(model->named_buffers().is_empty());
}

TEST(Gpt, ChangingTokenTChangesNoLogitBeforeT) {
  torch::manual_seed(1);
  auto model = make_gpt(tiny());
  model->eval();
  auto a = torch::randint(0, 256, {2, 16}, torch::kLong);
  const int64_t t = 9;
  auto b = a.clone();
  b.select(1, t).add_(1).remainder_(256);
  torch::NoGradGuard no_grad;
  auto la = model->forward(a), lb = model->forward(b);
  EXPECT_TRUE(torch::equal(la.slice(1, 0, t), lb.slice(1, 0, t)));
  // Negative control: position t and later do see the change.
  EXPECT_GT((la.slice(1, t) - lb.slice(1, t)).abs().max().item<double>(), 1e-4);
}

TEST(Gpt, HeadIsTiedToTheTokenEmbedding) {
  torch::manual_seed(2);
  auto model = make_gpt(tiny());
  model->eval();
  auto tokens = torch::randint(0, 256, {2, 8}, torch::kLong);
  auto logits = model->forward(tokens);
  // Changing wte changes the head too: the logits of a zero embedding row
  // are exactly 0, which only a tied head gives.
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()["wte.weight"][7].zero_();
  }
  auto after = model->forward(tokens);
  EXPECT_TRUE(torch::all(after.select(2, 7) == 0).item<bool>());
  EXPECT_FALSE(torch::all(logits.select(2, 7) == 0).item<bool>());
  // One gradient reaches wte from both uses.
  model->zero_grad();
  model->forward(tokens).sum().backward();
  auto g = model->named_parameters()["wte.weight"].grad();
  ASSERT_TRUE(g.defined());
  // Rows never fed as input still get gradient from the head.
  auto unused = torch::ones({256}, torch::kBool);
  unused.index_put_({tokens.flatten()}, false);
  EXPECT_GT(g.index({unused}).abs().sum().item<double>(), 0);
}

// layers(): embed, the blocks, head; every parameter belongs to exactly one
// layer's modules except the tied wte, which embed and head both list: a
// pipeline gives the head's stage its own copy (pipeline/tied.h), and
// parameter servers wait for it once, before embed, its first reader.
TEST(Gpt, LayersAreEmbedBlocksAndAHeadThatSharesWte) {
  auto model = make_gpt(tiny());
  const auto layers = model->layers();
  std::vector<std::string> names;
  for (const auto& layer : layers) names.push_back(layer.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "blocks.0", "blocks.1", "head"}));
  std::map<const void*, int> owners;
  for (const auto& layer : layers) {
    for (const auto& [name, module] : layer.modules) {
      for (const auto& p : module->parameters()) ++owners[p.unsafeGetTensorImpl()];
    }
  }
  EXPECT_EQ(owners.size(), model->parameters().size());
  const void* wte = model->named_parameters()["wte.weight"].unsafeGetTensorImpl();
  for (const auto& [impl, count] : owners) EXPECT_EQ(count, impl == wte ? 2 : 1);
  const auto& head = layers.back().modules;
  EXPECT_TRUE(std::any_of(head.begin(), head.end(), [&](const auto& m) {
    return m.first == "wte" && m.second.get() == model->named_children()["wte"].get();
  }));
}

TEST(Gpt, Gpt2InitScalesResidualProjections) {
  torch::manual_seed(3);
  GptOptions o = tiny();
  o.layers = 8;
  o.d_model = 128;
  auto params = make_gpt(o)->named_parameters();
  auto std_of = [&](const std::string& n) { return params[n].std().item<double>(); };
  EXPECT_NEAR(std_of("wte.weight"), 0.02, 0.002);
  EXPECT_NEAR(std_of("blocks.0.attn.qkv.weight"), 0.02, 0.002);
  EXPECT_NEAR(std_of("blocks.0.mlp.proj.weight"), 0.02 / 4.0, 0.0005);
  EXPECT_NEAR(std_of("blocks.3.attn.proj.weight"), 0.02 / 4.0, 0.0007);
  EXPECT_EQ(params["blocks.0.attn.qkv.bias"].abs().sum().item<double>(), 0);
}

TEST(Gpt, RejectsHeadsThatDoNotDivideTheWidth) {
  GptOptions o = tiny();
  o.heads = 5;
  EXPECT_THROW(make_gpt(o), c10::Error);
}

}  // namespace
}  // namespace paratrain::models

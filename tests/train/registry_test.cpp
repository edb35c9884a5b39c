// User models and datasets in the Trainer (train/registry.h): a registered
// name passes config validation and builds what its factory returns; a
// ZeRO-3 run over 2 ranks on a registered model and dataset equals one
// process on the global batch; built-in names cannot be replaced; a
// registered Sequential on a registered dataset trains in pipeline stages as
// one process does; a registered model that lists no layers is refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/registry.h"
#include "paratrain/train/trainer.h"
#include "paratrain/train/user_module.h"
#include "tests/support/multi_rank.h"

namespace {

namespace pt = paratrain::train;

class TwoLayer : public paratrain::models::Model {
 public:
  TwoLayer() : Model("two_layer") {
    fc1_ = register_module("fc1", torch::nn::Linear(4, 16));
    fc2_ = register_module("fc2", torch::nn::Linear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) override { return fc2_(torch::tanh(fc1_(x))); }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

paratrain::data::TensorDataset rows(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, 4}, gen);
  return {x, x.slice(1, 0, 3).argmax(1)};
}

void register_test_names() {
  pt::register_model("test_two_layer", [](const pt::TrainConfig&) { return std::make_shared<TwoLayer>(); });
  pt::register_model("test_sequential", pt::any_module([](const pt::TrainConfig&) {
                       return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Tanh(),
                                                    torch::nn::Linear(16, 16), torch::nn::Tanh(),
                                                    torch::nn::Linear(16, 3));
                     }));
  pt::register_dataset("test_rows", [](const pt::TrainConfig& c) {
    return pt::Datasets{rows(256, c.run.seed + 1), rows(64, c.run.seed + 2)};
  });
}

pt::TrainConfig config(const std::string& dir) {
  register_test_names();
  return pt::config_from_toml_string(
      "[run]\nname = \"r\"\noutput_dir = \"" + dir + "\"\nseed = 3\n"
      "[model]\nkind = \"test_two_layer\"\n[data]\ndataset = \"test_rows\"\nbatch_size = 16\n"
      "[optimizer]\nkind = \"sgd\"\nlr = 0.1\n[train]\nepochs = 2\n");
}

std::vector<at::Tensor> weights(pt::Trainer& t) {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : t.full_parameters()) out.push_back(p);
  return out;
}

TEST(Registry, RegisteredNamesBuildTheUsersModel) {
  auto c = config(paratrain::testing::temp_dir("registry"));
  auto model = pt::make_model(c);
  EXPECT_NE(dynamic_cast<TwoLayer*>(model.get()), nullptr);
  const auto kinds = pt::model_kinds();
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), "test_two_layer"), kinds.end());
}

TEST(Registry, BuiltinNamesAndPipelinesAreRefused) {
  EXPECT_THROW(pt::register_model("mlp", [](const pt::TrainConfig&) { return std::make_shared<TwoLayer>(); }),
               paratrain::ConfigError);
  EXPECT_THROW(pt::register_dataset("", [](const pt::TrainConfig&) { return pt::Datasets{}; }),
               paratrain::ConfigError);
  // A registered model that lists no layers cannot be cut into stages: the
  // pipeline strategy says so by the model's name.
  auto c = config(paratrain::testing::temp_dir("registry"));
  c.parallel.pp = 2;
  try {
    paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) { pt::Trainer t(c, g); });
    ADD_FAILURE() << "a model without layers was cut into stages";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be cut into pipeline stages"), std::string::npos) << e.what();
  }
  // An unregistered name lists the registered ones.
  try {
    pt::config_from_toml_string("[model]\nkind = \"nope\"\n");
    FAIL() << "expected a ConfigError";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("test_two_layer"), std::string::npos) << e.what();
  }
}

TEST(Registry, ZeroThreeOnTwoRanksEqualsOneProcess) {
  const auto dir = paratrain::testing::temp_dir("registry");
  auto one = config(dir + "/one");
  one.data.batch_size = 32;
  std::vector<at::Tensor> expected;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    pt::Trainer t(one, g);
    EXPECT_EQ(t.fit().steps, 2 * 256 / 32);
    expected = weights(t);
  });
  auto two = config(dir + "/two");
  two.zero.stage = 3;
  std::vector<std::vector<at::Tensor>> got(2);
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    pt::Trainer t(two, g);
    t.fit();
    got[g.rank()] = weights(t);
  });
  for (const auto& rank : got) {
    ASSERT_EQ(rank.size(), expected.size());
    for (size_t i = 0; i < rank.size(); ++i)
      EXPECT_TRUE(torch::allclose(rank[i], expected[i], 1e-4, 1e-6))
          << "param " << i << " max diff " << (rank[i] - expected[i]).abs().max().item<double>();
  }
}

}  // namespace

// A registered Sequential on a registered dataset (4 numbers per example, not
// an image) in 2 pipeline stages: the stages are cut at the data's shape,
// and 1f1b over 2 ranks trains the model one process trains.
TEST(Registry, ARegisteredSequentialTrainsInPipelineStages) {
  const auto dir = paratrain::testing::temp_dir("registry_pp");
  auto one = config(dir + "/one");
  one.model.kind = "test_sequential";
  one.data.batch_size = 32;
  one.train.epochs = 1;
  std::vector<at::Tensor> expected;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) {
    pt::Trainer t(one, g);
    t.fit();
    expected = weights(t);
  });
  auto staged = one;
  staged.run.output_dir = dir + "/pp";
  staged.parallel.pp = 2;
  staged.pipeline.schedule = "1f1b";
  staged.pipeline.microbatches = 4;
  std::vector<at::Tensor> got;
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    pt::Trainer t(staged, g);
    t.fit();
    auto w = weights(t);
    if (g.rank() == 0) got = std::move(w);
  });
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-5, 1e-6)) << i;
}

// Tied weights (one tensor registered under two names, as a GPT's embedding
// and output layer will be) through a checkpoint: the optimizer state is
// saved under one name and found again under that name on load.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/checkpoint/optimizer_state.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/strategies/common.h"
#include "tests/support/multi_rank.h"

namespace {

// "embed.weight" and "head_weight" name one tensor.
struct Tied : torch::nn::Module {
  Tied() {
    embed = register_module("embed", torch::nn::Linear(4, 4));
    head_weight = register_parameter("head_weight", embed->weight);
    head_bias = register_parameter("head_bias", torch::zeros({4}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return torch::nn::functional::linear(torch::relu(embed(x)), head_weight, head_bias);
  }
  torch::nn::Linear embed{nullptr};
  at::Tensor head_weight, head_bias;
};

TEST(TiedWeights, OptimizerStateSurvivesACheckpointUnderOneName) {
  namespace train = paratrain::train;
  torch::manual_seed(3);
  auto model = std::make_shared<Tied>();
  ASSERT_TRUE(model->embed->weight.is_same(model->head_weight));
  auto slots = train::strategies::replicated_optimizer_slots(*model, /*write=*/true);
  EXPECT_EQ(slots.size(), 3u);  // embed.weight (= head_weight), embed.bias, head_bias
  std::vector<at::Tensor> params;
  for (auto& s : slots) params.push_back(s.param);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  model->forward(torch::randn({3, 4})).sum().backward();
  opt.step();

  const auto dir = paratrain::testing::temp_dir("tied") + "/ckpt";
  paratrain::checkpoint::CheckpointContents save;
  save.model = train::strategies::replicated_slots(*model, true);
  save.optimizer = &opt;
  save.optimizer_slots = slots;
  paratrain::testing::run_ranks(1, [&](paratrain::comm::ProcessGroup& g) { paratrain::checkpoint::save_sharded_checkpoint(dir, g, save); });

  torch::manual_seed(99);  // different weights, no state: only the checkpoint can make them equal
  auto fresh = std::make_shared<Tied>();
  auto fresh_slots = train::strategies::replicated_optimizer_slots(*fresh, true);
  std::vector<at::Tensor> fresh_params;
  for (auto& s : fresh_slots) fresh_params.push_back(s.param);
  torch::optim::SGD fresh_opt(fresh_params, torch::optim::SGDOptions(0.1).momentum(0.9));
  paratrain::checkpoint::CheckpointContents load;
  load.model = train::strategies::replicated_slots(*fresh, true);
  load.optimizer = &fresh_opt;
  load.optimizer_slots = fresh_slots;
  paratrain::checkpoint::load_sharded_checkpoint(dir, load);

  EXPECT_TRUE(torch::equal(fresh->embed->weight, model->embed->weight));
  EXPECT_TRUE(fresh->embed->weight.is_same(fresh->head_weight));  // still tied after the in-place load
  for (size_t i = 0; i < slots.size(); ++i) {
    auto& a = static_cast<torch::optim::SGDParamState&>(*opt.state().at(paratrain::checkpoint::optimizer_state_key(params[i])));
    auto& b = static_cast<torch::optim::SGDParamState&>(*fresh_opt.state().at(paratrain::checkpoint::optimizer_state_key(fresh_params[i])));
    EXPECT_TRUE(torch::equal(a.momentum_buffer(), b.momentum_buffer())) << slots[i].slot.name;
  }
}

}  // namespace
